"""The first hour, again (issue 28): secrets offline, `make gpus` in the user's terms, and the small rough edges a
new user hit. Each test fails on the code before the fix; expected values come from the issue, the data files'
sources and Google's docs, never from the code under test."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from conftest import PROJECT_DIR, changed, config_model, config_problems, problems, stack_path, stack_run, yaml_load

from planner import cost, cost_markdown, model_catalog
from planner.__main__ import main as planner_main
from planner.requests import mode_request
from preview import summary, write_stack, write_stack_choice
from preview.__main__ import main as preview_main
from preview.sections import serving
from preview.write_stack import main as write_main

# --- item 4: the small ones ---------------------------------------------------------------------------------------


def test_the_terminals_serving_section_has_no_stray_code_fence_line() -> None:
    """The section's Markdown fences its commands with ```sh; the terminal printed `sh` as a line of its own."""
    ((_, body),) = serving.section(stack_run("serve"))
    lines = summary.markdown_text(body).splitlines()
    assert "  sh" not in lines and "  ```" not in lines and "  ```sh" not in lines
    start = lines.index('  Send one prompt (README, "Serving a model"):')
    assert lines[start + 1:start + 3] == ["", "  kubectl -n serving port-forward svc/chat 8000:8000 &"]


@pytest.mark.parametrize(("key", "url", "path", "form"), [
    ("workloads.tune.finetune.datasetPath", "gs://my-data/data/train.jsonl", "data/train.jsonl",
     "a file or folder of the bucket such as data/train.jsonl"),
    ("workloads.tune.finetune.modelPath", "gs://my-data/models/base/", "models/base",
     "a folder of the bucket such as models/base/Qwen2.5-7B"),
    ("workloads.chat.serving.modelPath", "gs://my-data/models/tune", "models/tune",
     "a folder in the bucket such as models/Mistral-7B-Instruct-v0.3"),
])
def test_a_gs_url_as_a_bucket_path_is_told_to_drop_the_prefix(key: str, url: str, path: str, form: str) -> None:
    """Was `"gs://..." is not of the form ...`: the user had the right object in mind, in the other spelling."""
    assert problems("finetune", {key: url}) == [
        f'{key}: "{url}" is a gs:// URL; drop the gs:// prefix and the bucket\'s name: "{path}", a path in the '
        f"stack's bucket ({form})"]


def test_a_bucket_path_that_is_not_a_url_keeps_its_message() -> None:
    key = "workloads.tune.finetune.datasetPath"
    assert problems("finetune", {key: "data/x y.jsonl"}) == [
        f'{key}: "data/x y.jsonl" is not of the form a file or folder of the bucket such as data/train.jsonl']


def test_filestore_basic_hdd_minimum_is_1_tib_and_100_gib_through_gkes_driver_from_1_33() -> None:
    """Filestore's service tiers: Basic HDD 1 TiB to 63.9 TiB; "Basic HDD (on GKE)" from 100 GiB through the CSI
    driver, which GKE's driver page gives from GKE 1.33 (the driver's defaultTierMinSize: 100 GiB since v1.10.0)."""
    with open(PROJECT_DIR / "data" / "gpu_catalog.yaml", encoding="utf-8") as fh:
        tier = yaml_load(fh)["filestore"]["tiers"]["basic-hdd"]
    assert (tier["minGiB"], tier["gke"]) == (1024, {"since": "1.33", "minGiB": 100})


@pytest.mark.parametrize(("version", "billed"), [("1.32", 1024), ("1.33", 100), ("1.34.1-gke.1", 100)])
def test_a_small_claim_is_billed_at_the_minimum_of_the_clusters_gke(version: str, billed: int) -> None:
    """A 50Gi claim: GKE before 1.33 provisions (and bills) Filestore's own minimum, 1 TiB; the idle cost had
    100 GiB whatever the version."""
    cfg = config_model(changed("h100", {"workloads.smoke.storage.size": "50Gi"}))
    cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, min_master_version=version))
    (claim,) = cost.stack_costs(cfg)["filestore"]["claims"]
    assert (claim["requested"], claim["billedGiB"]) == ("50Gi", billed)


def test_a_release_channels_cluster_gets_the_channels_version() -> None:
    """h100 pins 1.33; finetune sets no version: REGULAR's default (data/gke_drivers.yaml, 1.34) bills 100 GiB."""
    cfg = config_model(changed("finetune", {"workloads.tune.storage.size": "100Gi"}))
    assert (cfg.cluster.min_master_version, cfg.cluster.release_channel) == (None, "REGULAR")
    (claim,) = cost.stack_costs(cfg)["filestore"]["claims"]
    assert claim["billedGiB"] == 100


def test_the_catalogs_prices_are_us_central1s() -> None:
    """data/gpu_catalog.yaml's price sources: "PRICES ARE ESTIMATES in USD for us-central1 list prices"."""
    with open(PROJECT_DIR / "data" / "gpu_catalog.yaml", encoding="utf-8") as fh:
        assert yaml_load(fh)["pricedRegions"] == ["us-central1"]


def test_the_planner_names_a_region_priced_as_another(capsys: pytest.CaptureFixture[str]) -> None:
    """asia-southeast1's tables printed us-central1's prices as if they were its own."""
    assert planner_main(["--model", "Qwen2.5-7B", "--mode", "inference", "--region", "asia-southeast1"]) == 0
    assert "Prices are estimates in USD, asia-southeast1 priced as us-central1 (data/gpu_catalog.yaml" in \
        capsys.readouterr().out
    assert planner_main(["--model", "Qwen2.5-7B", "--mode", "inference"]) == 0
    assert "Prices are estimates in USD, us-central1 list prices (data/gpu_catalog.yaml" in capsys.readouterr().out


def test_a_stack_outside_the_priced_regions_says_whose_prices_it_shows() -> None:
    """dev is in us-west1: its costs were us-central1's, called 'list prices of one region'."""
    west = cost.stack_costs(config_model(changed("dev")))
    assert (west["prices"], west["pricedAs"]) == ("us-west1 priced as us-central1", "us-central1")
    assert "(list-price estimates, us-west1 priced as us-central1; see Estimated cost)." in cost_markdown.headline(west)
    assert ": us-west1 priced as us-central1; disks, network egress" in cost_markdown.costs_markdown(west)
    central = cost.stack_costs(config_model(changed("finetune")))
    assert (central["prices"], "pricedAs" in central) == ("us-central1 list prices", False)
    assert "(list-price estimates; see Estimated cost)." in cost_markdown.headline(central)


# --- item 2: secrets offline ---------------------------------------------------------------------------------------

# Both ways to set a secret, as every message about one says them.
TOKEN_WAYS = ("set it with `pulumi config set --secret hfToken hf_...`, or, to preview without the Pulumi CLI, write "
              "`deepspeed-stack:hfToken: {secure: <any text>}` under `config:` in the stack file (the preview never "
              "reads the value; `pulumi up` needs the one `pulumi config set --secret` encrypts)")


def test_a_plain_text_token_names_both_ways_to_set_it() -> None:
    """Was: "set it with `pulumi config set --secret`", which needs the Pulumi CLI the offline preview does without."""
    assert problems("finetune", {"hfToken": "hf_plain"}) == [
        f"hfToken: must be a secret, not plain text in the stack file; {TOKEN_WAYS}"]


@pytest.mark.parametrize("value", ["hf_plain", {"secure": "v1:planted"}])
def test_a_token_under_a_workload_is_told_it_is_a_top_level_key(value: object) -> None:
    """Was "unknown key; did you mean `hfHome`?" (plain), or "workloads: is set as a secret, but the stack would
    write it in plain text" (`pulumi config set --secret --path workloads.tune.hfToken`)."""
    assert problems("finetune", {"workloads.tune.hfToken": value}) == [
        "workloads.tune.hfToken: hfToken is a top-level key of the stack (one for all its workloads), not a "
        f"workload's; {TOKEN_WAYS}"]


def test_kubeconfig_elsewhere_shows_its_own_command() -> None:
    assert problems("gaudi", {"kubernetes.kubeconfig": "apiVersion: v1"}) == [
        "kubernetes.kubeconfig: kubeconfig is a top-level key of the stack (one for all its workloads), not "
        "`kubernetes`'s; set it with `pulumi config set --secret kubeconfig \"$(cat ~/.kube/config)\"`, or, to "
        "preview without the Pulumi CLI, write `deepspeed-stack:kubeconfig: {secure: <any text>}` under `config:` "
        "in the stack file (the preview never reads the value; `pulumi up` needs the one `pulumi config set "
        "--secret` encrypts)"]


def test_a_gated_model_without_a_token_names_both_ways() -> None:
    (found,) = problems("finetune", {"workloads.tune.finetune.model": "meta-llama/Llama-3.1-8B-Instruct",
                                     "workloads.chat.model.name": "Llama-3.1-8B",
                                     "workloads.chat.model.batchSize": 4})
    assert found.startswith("workloads.tune.finetune.model: meta-llama/Llama-3.1-8B-Instruct is gated")
    assert f"give the stack a read token of that account: {TOKEN_WAYS}; or use a model" in found


def test_the_offline_form_as_the_messages_write_it_previews(tmp_path: Path) -> None:
    """The line the messages give, pasted under `config:` of a gated stack, previews with `make preview`."""
    text = stack_path("finetune").read_text(encoding="utf-8")
    text = text.replace("model: Qwen/Qwen2.5-7B-Instruct", "model: meta-llama/Llama-3.1-8B-Instruct")
    # As the recipe's comment says for Llama: the server's model and a batch of 4 (its KV cache is twice Qwen's).
    text = text.replace("        name: Qwen2.5-7B\n", "        name: Llama-3.1-8B\n")
    text = text.replace("batchSize: 8", "batchSize: 4")
    gated = tmp_path / "Pulumi.gated.yaml"
    gated.write_text(text, encoding="utf-8")
    assert preview_main(["--stack", "gated", "--stack-file", str(gated), "--out", str(tmp_path / "out")]) == 2
    gated.write_text(text.replace("config:\n", "config:\n  deepspeed-stack:hfToken: {secure: <any text>}\n", 1),
                     encoding="utf-8")
    assert preview_main(["--stack", "gated", "--stack-file", str(gated), "--out", str(tmp_path / "out")]) == 0


# --- item 3: `make gpus` in the user's terms -----------------------------------------------------------------------

# What people type (the model cards' repository names, case as it comes, an Instruct or chat variant, a Hugging Face
# id), the data/models.yaml entry each is, and the Hugging Face id the pods then download.
TYPED = [
    ("Qwen2.5-7B-Instruct", "Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("qwen2.5-7b-instruct", "Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen2.5-72B-Instruct", "Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
    ("Llama-3.1-8B-Instruct", "Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ("Meta-Llama-3-8B-Instruct", "Llama-3.1-8B", "meta-llama/Meta-Llama-3-8B-Instruct"),
    ("Llama-3.2-1B-Instruct", "Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
    ("Llama-2-7b-chat-hf", "Llama-2-7B", "meta-llama/Llama-2-7b-chat-hf"),
    ("Llama-2-7B-chat", "Llama-2-7B", "meta-llama/Llama-2-7b-chat-hf"),  # the converted checkpoint, not Meta's
    ("Llama-2-7B", "Llama-2-7B", "meta-llama/Llama-2-7b-hf"),
    ("CodeLlama-34b-Instruct-hf", "CodeLlama-34B", "meta-llama/CodeLlama-34b-Instruct-hf"),
    ("Mistral-7B-Instruct-v0.3", "Mistral-7B", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("Mistral-7B-Instruct", "Mistral-7B", "mistralai/Mistral-7B-Instruct-v0.3"),  # the newest listed
    ("Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    ("gemma-2-9b-it", "Gemma-2-9B", "google/gemma-2-9b-it"),
    ("falcon-7b-instruct", "Falcon-7B", "tiiuae/falcon-7b-instruct"),
]


@pytest.mark.parametrize(("typed", "entry", "hub"), TYPED)
def test_the_names_people_type_resolve(typed: str, entry: str, hub: str) -> None:
    """`MODEL=Qwen2.5-7B-Instruct` was an unknown model while `Qwen/Qwen2.5-7B-Instruct` worked."""
    assert (model_catalog.resolve(typed).name, model_catalog.hub_id(typed)) == (entry, hub)


def test_a_typed_name_is_what_the_written_stack_downloads(tmp_path: Path) -> None:
    assert write_main(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--stack", "ft", "--serve", "0",
                       "--dir", str(tmp_path)]) == 0
    config = yaml_load((tmp_path / "Pulumi.ft.yaml").read_text(encoding="utf-8"))["config"]
    train = config["deepspeed-stack:workloads"]["train"]
    assert (train["finetune"]["model"], train["model"]["name"]) == ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B")


@pytest.fixture
def under_make(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the Makefile runs the programs (DEEPSPEED_STACK_MAKE=1)."""
    monkeypatch.setenv("DEEPSPEED_STACK_MAKE", "1")


def _fail(main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_argument_errors_name_make_variables_under_make(under_make: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`make gpus ... BUDGET=abc` said `argument --budget`, a flag the user never typed."""
    err = _fail(write_main, ["--model", "7B", "--mode", "inference", "--stack", "s", "--budget", "abc"], capsys)
    assert err.splitlines()[-1] == "make gpus: error: argument BUDGET=: invalid float value: 'abc'"
    assert err.startswith("usage: make gpus MODEL=")
    assert _fail(planner_main, ["--model", "7B"], capsys).splitlines()[-1] == \
        "make gpus: error: MODE=inference|training|finetune is required"
    assert _fail(planner_main, ["--model", "7B", "--mode", "training", "--seq", "0"], capsys).splitlines()[-1] == \
        "make gpus: error: SEQ=, BATCH=, TOP= and --max-nodes must be at least 1"


def test_argument_errors_name_flags_when_run_directly(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fail(write_main, ["--model", "7B", "--mode", "inference", "--stack", "s", "--budget", "abc"], capsys)
    assert err.splitlines()[-1] == "python -m preview.write_stack: error: argument --budget: invalid float value: 'abc'"
    assert _fail(planner_main, ["--model", "7B"], capsys).splitlines()[-1] == \
        "python -m planner: error: --mode inference|training|finetune is required"


def test_the_makefile_passes_force_serve_and_says_it_runs_under_make() -> None:
    """FORCE=1 had no Makefile variable ("pass --force"); SERVE= is new."""
    dry = subprocess.run(["make", "-n", "-s", "--no-print-directory", "-C", str(PROJECT_DIR), "gpus",
                          "MODEL=Qwen2.5-7B-Instruct", "MODE=finetune", "WRITE=s", "BUDGET=2", "SERVE=0", "FORCE=1"],
                         capture_output=True, text=True, check=True).stdout
    (line,) = [line for line in dry.splitlines() if "preview.write_stack" in line]
    assert line.startswith("DEEPSPEED_STACK_MAKE=1 ")
    assert ' --stack "s" ' in line and ' --budget "2" ' in line and ' --serve "0" ' in line and " --force " in line
    dry = subprocess.run(["make", "-n", "-s", "--no-print-directory", "-C", str(PROJECT_DIR), "gpus",
                          "MODEL=Qwen2.5-7B", "MODE=inference", "WRITE=s", "FORCE=0"],
                         capture_output=True, text=True, check=True).stdout
    assert "--force" not in dry


def test_an_existing_file_names_force(under_make: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Pulumi.s.yaml").write_text("config: {}\n", encoding="utf-8")
    assert write_main(["--model", "7B", "--mode", "inference", "--stack", "s", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: Pulumi.s.yaml exists; choose another WRITE= name (or FORCE=1 to " \
                                      "replace it)\n"


def test_a_write_name_is_checked_before_planning(under_make: None, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`WRITE=my_stack` planned, then failed three times on the cluster name; now it fails first, with the checks'
    own message for `cluster.name`."""
    monkeypatch.setattr(write_stack, "choose", lambda *a, **k: pytest.fail("planned before checking WRITE="))
    assert write_main(["--model", "7B", "--mode", "inference", "--stack", "my_stack", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: WRITE=my_stack: the stack's cluster is named after it (deepspeed-<stack>), and cluster.name: "
        "'deepspeed-my_stack' is not a GKE cluster name (lowercase letters, digits and hyphens, starting with a "
        "letter, at most 40 characters); e.g. WRITE=my-stack\n")
    assert not list(tmp_path.iterdir())


def test_a_bad_region_gets_the_same_did_you_mean_with_and_without_write(under_make: None, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """With WRITE= it was "no plan ... (the planner found no option)"."""
    assert planner_main(["--model", "7B", "--mode", "inference", "--region", "asia-southest1"]) == 2
    printed = capsys.readouterr().err
    assert write_main(["--model", "7B", "--mode", "inference", "--region", "asia-southest1", "--stack", "s",
                       "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == printed
    assert printed.startswith("error: REGION=asia-southest1 is not a region of data/gpu_catalog.yaml")
    assert printed.endswith("; did you mean `asia-southeast1`?\n")


@pytest.fixture(scope="module")
def prices() -> dict[str, float]:
    """$/h from data/gpu_catalog.yaml: one L4 on a g2-standard-4, the system pool's e2-standard-4, the cluster fee,
    and a 100 GiB Basic HDD claim (the written download claim)."""
    with open(PROJECT_DIR / "data" / "gpu_catalog.yaml", encoding="utf-8") as fh:
        raw = yaml_load(fh)
    return {"l4": raw["gpus"]["nvidia-l4"]["machines"]["g2-standard-4"]["price"]["onDemand"],
            "system": raw["generalMachines"]["e2-standard-4"]["price"]["onDemand"],
            "fee": raw["gkeClusterFeePerHour"], "claim": 100 * raw["filestore"]["tiers"]["basic-hdd"]["perGiBHour"]}


def _written(tmp_path: Path, *argv: str) -> tuple[str, dict]:
    assert write_main(["--stack", "s", "--dir", str(tmp_path), *argv]) == 0
    text = (tmp_path / "Pulumi.s.yaml").read_text(encoding="utf-8")
    return text, yaml_load(text)["config"]


def test_finetune_writes_the_server_of_its_result_by_default(tmp_path: Path, prices: dict[str, float]) -> None:
    """MODE=finetune wrote training only, and adding the recipe's server went over the budget without a word. The
    7B LoRA run fits one L4 (g2-standard-4), and so does its server; both run while it trains (the server's node
    up, waiting in Init), so the budget holds both."""
    both = 2 * prices["l4"] + prices["system"] + prices["fee"] + prices["claim"]  # 1.6814
    text, config = _written(tmp_path, "--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--budget",
                            f"{both + 0.01:.2f}")
    workloads = config["deepspeed-stack:workloads"]
    assert [(n, w["kind"]) for n, w in workloads.items()] == [("train", "finetune"), ("serve", "serve")]
    serve = workloads["serve"]
    assert serve["serving"]["fromWorkload"] == "train" and "model" not in serve["serving"]
    assert serve["gcsFuse"]["enabled"] is True and serve["model"]["mode"] == "inference"
    assert [(p["name"], p["machineType"]) for p in config["deepspeed-stack:nodePools"]] == [
        ("l4", "g2-standard-4"), ("l4-serve", "g2-standard-4")]
    header = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    assert f"Estimated cost: ${both:,.2f}/h while it trains, with the server's node up and waiting; " in header
    assert config_problems(config) == []


def test_the_budget_counts_training_and_its_server_and_serve_0_leaves_it_out(tmp_path: Path,
                                                                            prices: dict[str, float]) -> None:
    alone = prices["l4"] + prices["system"] + prices["fee"] + prices["claim"]  # 0.9714
    both = alone + prices["l4"]
    budget = f"{(alone + both) / 2:.2f}"
    with pytest.raises(write_stack_choice.NoPlanError) as refused:
        write_stack_choice.choose(mode_request("finetune", model_catalog.resolve("Qwen2.5-7B")), "us-central1",
                                  "s", float(budget), serve=True)
    assert (f"${both:,.2f}/h with training and its server running (--serve 0: training alone), over the budget "
            f"${float(budget):,.2f}/h") in str(refused.value)
    _, config = _written(tmp_path, "--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--budget", budget,
                         "--serve", "0")
    assert list(config["deepspeed-stack:workloads"]) == ["train"]


def test_serve_1_adds_the_server_to_a_training_stack_too(tmp_path: Path) -> None:
    _, config = _written(tmp_path, "--model", "Qwen2.5-7B", "--mode", "training", "--serve", "1")
    assert [w["kind"] for w in config["deepspeed-stack:workloads"].values()] == ["finetune", "serve"]


@pytest.mark.parametrize("mode", ["finetune", "training"])
def test_the_written_next_steps_create_the_stack_and_bring_in_every_data_path(tmp_path: Path, mode: str) -> None:
    """The header's next step went from `make preview` to `pulumi up` without creating the stack; MODE=training
    wrote its data onto a claim that `pulumi up` creates with the job that needs it. Every path the stack reads
    from the bucket now has its `gcloud storage cp`, to that path of the bucket the stack outputs."""
    text, config = _written(tmp_path, "--model", "Qwen2.5-7B", "--mode", mode)
    header = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
    joined = " ".join(header)
    steps = [joined.index(s) for s in ("1. Set gcp:project below", "2. `pulumi stack init s` creates the stack",
                                       "3. `make preview STACK=s`", "4. `pulumi up -s s`.")]
    assert steps == sorted(steps)
    for name, w in config["deepspeed-stack:workloads"].items():
        for key in ("datasetPath", "modelPath"):
            path = (w.get("finetune") or {}).get(key)
            if path:
                assert w["gcsFuse"]["enabled"] is True  # in the bucket, where the launcher waits for it
                assert f"`gcloud storage cp train.jsonl gs://$(pulumi stack output bucket -s s)/{path}`" in joined
                assert f"(workloads.{name}.finetune.{key}, in the bucket `pulumi up` created)" in joined
        assert w["kind"] in ("finetune", "serve")  # no MPIJob reading a claim nothing fills


def test_a_gated_models_steps_set_the_token_after_creating_the_stack(tmp_path: Path) -> None:
    text, _ = _written(tmp_path, "--model", "Llama-3.1-8B-Instruct", "--mode", "inference")
    joined = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    assert "2. `pulumi stack init s` creates the stack" in joined
    assert "3. `pulumi config set --secret hfToken hf_... -s s`: meta-llama/Llama-3.1-8B-Instruct is gated" in joined
    assert f"{TOKEN_WAYS[0].upper()}{TOKEN_WAYS[1:]}." in joined  # both ways, the offline form too


def test_a_written_finetune_stack_with_its_server_previews(tmp_path: Path) -> None:
    assert write_main(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--stack", "ft", "--dir",
                       str(tmp_path)]) == 0
    assert preview_main(["--stack", "ft", "--stack-file", str(tmp_path / "Pulumi.ft.yaml"), "--out",
                         str(tmp_path / "out")]) == 0


def test_the_written_prompt_command_asks_as_the_model_was_trained(tmp_path: Path) -> None:
    """Issue 36 item 6: a written finetune stack's server is asked the way its run trains (the stack's own
    records go through the Instruct model's chat template: the chat endpoint), the same command the preview
    prints."""
    text, config = _written(tmp_path, "--model", "Qwen2.5-7B-Instruct", "--mode", "finetune")
    joined = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    (server,) = [name for name, w in config["deepspeed-stack:workloads"].items() if w["kind"] == "serve"]
    trainer = config["deepspeed-stack:workloads"][server]["serving"]["fromWorkload"]
    assert (f"`python -m recipes.send_prompt --openai --chat --url http://localhost:8000 --model "
            f"{trainer} \"What is DeepSpeed?\"`") in joined
