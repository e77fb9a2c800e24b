"""The first hour, again (issue 28): secrets offline, `make gpus` in the user's terms, and the small rough edges a
new user hit. Each test fails on the code before the fix; expected values come from the issue, the data files'
sources and Google's docs, never from the code under test."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from conftest import PROJECT_DIR, changed, config_model, problems, stack_run, yaml_load

from planner import cost
from planner.__main__ import main as planner_main
from preview import summary
from preview.__main__ import main as preview_main
from preview.sections import serving

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
    assert "(list-price estimates, us-west1 priced as us-central1; see Estimated cost)." in cost.headline(west)
    assert ": us-west1 priced as us-central1; disks, network egress" in cost.costs_markdown(west)
    central = cost.stack_costs(config_model(changed("finetune")))
    assert (central["prices"], "pricedAs" in central) == ("us-central1 list prices", False)
    assert "(list-price estimates; see Estimated cost)." in cost.headline(central)


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
    text = (PROJECT_DIR / "Pulumi.finetune.yaml").read_text(encoding="utf-8")
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
