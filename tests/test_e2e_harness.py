"""The pure parts of the e2e harness (e2e/run.py): what it reads from the image and renders as the chart,
the operator and Vertex AI would; and the MPIJob launcher's environment for remote ranks that the e2e found.
The launches themselves run in `make e2e` (root, network namespaces), not here."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from conftest import load_file, model

from workloads import mpijob
from workloads.placement import placement

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    return load_file(ROOT / "e2e" / "run.py", "e2e_run")  # its folder on sys.path while it loads: hosts.py


def test_image_sshd_drop_in_is_read_from_the_dockerfile(e2e: ModuleType) -> None:
    lines = e2e.image_sshd_drop_in().splitlines()
    assert "Port 2222" in lines and "UsePAM no" in lines and "PermitUserEnvironment yes" in lines
    assert "PidFile /tmp/sshd.pid" in lines
    assert not any("'" in line for line in lines)


def test_hostfiles_as_the_chart_and_the_operator_write_them(e2e: ModuleType) -> None:
    assert e2e.chart_hostfile(2, 1) == ("e2e-deepspeed-worker-0.e2e-deepspeed-worker-headless slots=1\n"
                                        "e2e-deepspeed-worker-1.e2e-deepspeed-worker-headless slots=1\n")
    assert e2e.mpijob_hostfile(1, 4) == "ds-e2e-worker-0.ds-e2e.e2e.svc slots=4\n"


def test_every_name_a_launch_path_uses_resolves_to_a_host(e2e: ModuleType) -> None:
    names = {n for host, aliases in e2e.host_names(2) for n in (host, *aliases)}
    assert {line.split()[0] for line in e2e.chart_hostfile(2, 1).splitlines()} <= names
    assert {line.split()[0] for line in e2e.mpijob_hostfile(2, 1).splitlines()} <= names
    spec = json.loads(e2e.vertex_cluster_spec("workerpool1", 1, 2))
    hosts = [a.split(":")[0] for pool in spec["cluster"].values() for a in pool]
    assert hosts == ["workerpool0-0", "workerpool1-0", "workerpool1-1"] and set(hosts) <= names
    assert spec["task"] == {"type": "workerpool1", "index": 1, "trial": ""}


def test_check_run_and_losses(e2e: ModuleType) -> None:
    good = ("[smoke] rank 0 on w-0: 10.0 samples/s, peak memory 0.0 MiB, loss 1.0\n"
            "[smoke] rank 1 on w-1: 12.5 samples/s, peak memory 0.0 MiB, loss 1.0\n"
            "[smoke] step 1 loss 1.250000\n[smoke] step 2 loss 0.750000\n"
            'SMOKE_TEST_RESULT {"ok": true, "world_size": 2, "hosts": ["w-0", "w-1"]}\n')
    assert e2e.check_run(good, 2, ["w-1", "w-0"]) == []
    assert e2e.losses(good) == {1: 1.25, 2: 0.75}
    assert e2e.check_run(good, 3, ["w-0", "w-1"]) == ["world size 2, expected 3", "rank 2 did not report"]
    assert e2e.check_run("no result", 1, ["w-0"]) == ["no SMOKE_TEST_RESULT line"]


def test_mpijob_launcher_hands_path_to_the_ranks() -> None:
    # Found by the e2e: sshd sets PATH itself, whatever the launcher's ssh sends (SendEnv), so ranks started
    # over pdsh ran without the image's venv on PATH (no ninja for DeepSpeed's JIT-built ops). DeepSpeed's
    # runner exports ~/.deepspeed_env's lines to every rank: the launcher writes PATH there before launching.
    m = model("dev", {"workloads": {"ds-t4": copy.deepcopy({"kind": "mpijob", "pool": "t4", "workers": 2,
                                                            "deepspeed": {"precision": "fp16"},
                                                            "storage": {"storageClass": "standard-rwx"}})},
                      "mpiOperator.install": True})
    script = mpijob.nvidia_launcher_script(m.workloads["ds-t4"])
    lines = script.splitlines()
    env_line = next(i for i, line in enumerate(lines) if ".deepspeed_env" in line)
    assert lines[env_line] == ('printf "PATH=%s\\nLD_LIBRARY_PATH=%s\\n" "$PATH" "${LD_LIBRARY_PATH:-}" '
                               '>> "$HOME/.deepspeed_env"')
    assert env_line < next(i for i, line in enumerate(lines) if line.startswith("run_ranks deepspeed"))
    assert placement(m, m.workloads["ds-t4"]) is not None


# --- the finetune scenario's pure parts ---------------------------------------------------------------------------

def test_install_sh_installs_the_version_set() -> None:
    # e2e/install.sh reads data/versions.yaml itself (an awk parser, no YAML library in a fresh machine's python);
    # what it would install must be the set the image ships.
    import subprocess

    from model import versions

    out = subprocess.run(["bash", str(ROOT / "e2e" / "install.sh"), "--print-versions"], capture_output=True,
                         text=True, check=True, timeout=10).stdout.split()
    python = versions.load().python
    assert dict(item.split("=", 1) for item in out) == {
        name: python[name] for name in ("torch", "deepspeed", "transformers", "accelerate", "peft", "datasets",
                                        "vllmCpu", "lmEval", "tensorboard")}
    assert python["vllmCpu"] == python["vllm"]  # the CPU build of the release the image serves with


def test_finetune_records(e2e: ModuleType) -> None:
    records = e2e.finetune_records()
    assert len(records) == 64 and len({json.dumps(r) for r in records}) == 64
    system = {"role": "system", "content": "You add numbers."}
    assert records[2 * 8 + 3] == {"messages": [system, {"role": "user", "content": "What is two plus three?"},
                                               {"role": "assistant", "content": "two plus three is 5."}]}
    # Every eighth conversation has two assistant turns, both learned.
    assert records[3 * 8 + 3]["messages"][3:] == [{"role": "user", "content": "And three plus three?"},
                                                  {"role": "assistant", "content": "three plus three is 6 too."}]
    assert sum(len(r["messages"]) == 5 for r in records) == 8
    # The held-out conversation is no record's: its second question is asked after another first one.
    held_out = e2e.FINETUNE_HELD_OUT
    assert held_out[-1]["role"] == "user" and not [r for r in records if r["messages"][:len(held_out)] == held_out]
    assert e2e.FINETUNE_SAVE_STEPS < e2e.FINETUNE_STEPS  # a checkpoint before the preemption
    assert e2e.outside("/gcs/models/ds-e2e", "/gcs", Path("/w/bucket")) == Path("/w/bucket/models/ds-e2e")


def test_trainer_output_is_read(e2e: ModuleType) -> None:
    output = ("ds-e2e-worker-0: [finetune] rank 0/2: 64 samples, ZeRO-3, fp32; resuming from "
              "/storage/checkpoints/ds-e2e/checkpoint-6\n"
              "ds-e2e-worker-1: [finetune] rank 1/2: 64 samples, ZeRO-3, fp32; resuming from /elsewhere/checkpoint-1\n"
              "ds-e2e-worker-0: {'loss': '4.063', 'grad_norm': '2.303', 'learning_rate': '0.002325', 'epoch': '1.25'}\n"
              "ds-e2e-worker-0: {'loss': 1.877, 'grad_norm': 1.453}\n"
              "ds-e2e-worker-0: {'train_runtime': '7.5', 'train_loss': '2.634', 'epoch': '5'}\n")
    assert e2e.resumed_from(output) == "/storage/checkpoints/ds-e2e/checkpoint-6"
    assert e2e.resumed_from("[finetune] rank 0/2: 64 samples, ZeRO-3, fp32; from the start") is None
    assert e2e.trainer_losses(output) == [4.063, 1.877]
    assert e2e.eval_losses("ds-e2e-worker-0: {'eval_loss': '5.2', 'eval_runtime': '0.1', 'epoch': '0.7'}\n"
                           "ds-e2e-worker-0: {'eval_loss': 4.9}") == [5.2, 4.9]


def test_the_trained_record_must_be_the_templates_rendering(e2e: ModuleType) -> None:
    rendered = {"input_ids": [1, 5, 6, 7, 8], "marked_ids": [1, 5, 6, 7, 8], "assistant_masks": [0, 0, 0, 1, 1]}
    assert e2e.sample_problems({"input_ids": [1, 5, 6, 7, 8], "labels": [-100, -100, -100, 7, 8]}, rendered) == []
    assert e2e.sample_problems({"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}, rendered) == [
        "trained ids [5, 6, 7, 8] != apply_chat_template's [1, 5, 6, 7, 8]",
        "trained labels [-100, -100, 7, 8] != the assistant turns' [-100, -100, -100, 7, 8]"]
    # The user's turn learned too: caught.
    assert e2e.sample_problems({"input_ids": [1, 5, 6, 7, 8], "labels": [-100, 5, 6, 7, 8]}, rendered) == [
        "trained labels [-100, 5, 6, 7, 8] != the assistant turns' [-100, -100, -100, 7, 8]"]


def test_vllms_chat_answer_must_be_transformers_greedy_tokens_after_the_template(e2e: ModuleType) -> None:
    reference = {"prompt_token_ids": [0, 272, 263], "token_ids": [87, 276, 273]}
    answer = {"prompt_token_ids": [0, 272, 263], "usage": {"completion_tokens": 3},
              "choices": [{"message": {"content": "x"}, "token_ids": [87, 276, 273]}]}
    assert e2e.chat_problems(answer, reference, 3) == []
    assert e2e.chat_problems({**answer, "prompt_token_ids": [272, 263]}, reference, 3) == [
        "vLLM rendered the conversation as [272, 263], transformers' template as [0, 272, 263]"]


def test_vllms_answer_must_be_transformers_greedy_tokens(e2e: ModuleType) -> None:
    reference = {"prompt_token_ids": [0, 272, 263], "token_ids": [87, 276, 273]}
    answer = {"choices": [{"text": "three plus", "prompt_token_ids": [0, 272, 263], "token_ids": [87, 276, 273]}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
    assert e2e.completion_problems(answer, reference, 3) == []
    short = {"choices": [{"prompt_token_ids": [0, 272, 263], "token_ids": [87, 1]}], "usage": {"completion_tokens": 2}}
    assert e2e.completion_problems(short, reference, 3) == [
        "completion_tokens 2, expected 3", "vLLM's tokens [87, 1] != transformers' greedy [87, 276, 273]"]
    assert e2e.completion_problems({}, reference, 3) == [
        "completion_tokens None, expected 3", "prompt tokens None != transformers' [0, 272, 263]",
        "vLLM's tokens None != transformers' greedy [87, 276, 273]"]


def test_finetune_runs_in_make_e2e(e2e: ModuleType) -> None:
    assert "finetune" in e2e.DEFAULT_SCENARIOS and e2e.SCENARIOS["finetune"] is e2e.scenario_finetune
    # Head size 32 or more: vLLM's CPU attention crashes on the first request below it (FACTS.md).
    spec = importlib.util.spec_from_file_location("e2e_tiny_llm", ROOT / "e2e" / "tiny_llm.py")
    assert spec is not None and spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    assert tiny.HIDDEN >= 64 and tiny.HIDDEN // tiny.HEADS >= 32


def test_the_finetune_kind_renders_the_trainers_launch(e2e: ModuleType) -> None:
    from workloads.mpijob import nvidia

    w, where, launch = e2e.finetune_workload()
    assert w.kind == "finetune" and w.name == e2e.MPIJOB
    script = nvidia.launcher_script(None, launch)
    assert ("/etc/deepspeed/finetune.py --deepspeed /etc/deepspeed/ds_config.json --model /gcs/e2e-finetune/base "
            "--dataset /gcs/e2e-finetune/data.jsonl --format auto --records messages --eval-split 0.125") in script
    assert "--lora" in script and "--max-steps 30" in script
    assert script.endswith("--logging-steps 5 --copy-rate-mb 0.25")
    # The data check and the tokenized data first.
    # (on the first worker, over ssh: tests/test_finetune_kind.py runs the line)
    assert "check_inputs ssh -o BatchMode=yes \"$MASTER_ADDR\" " in script
    assert "'python /etc/deepspeed/finetune.py --prepare-data " in script
    # The contract's layout on the bucket's mount, and the stack's key names, in the environment every rank is sent.
    # The progress callback's: LoRA's 4N FLOPs a token of the tiny Llama's 150k parameters (the model block's
    # 0.00015 B) = 600,000; the CPU's stand-in peak and price; TensorBoard's folder under logs/ in the bucket.
    # And the run's estimate (test_the_e2e_estimate_rests_on_the_cpu_rows_and_counts_its_saves).
    assert json.loads(launch.env["FINETUNE_ESTIMATE"])["evidence"][0] == "ours-e2e-tiny-llama-lora-cpu-q1"
    assert {k: v for k, v in launch.env.items() if k not in ("FINETUNE_STACK_KEYS", "FINETUNE_ESTIMATE")} == {
        "CHECKPOINT_DIR": "/gcs/checkpoints/ds-e2e", "MODEL_DIR": "/gcs/models/ds-e2e",
        "FINETUNE_MODEL_FLOPS": "600000", "FINETUNE_PEAK_TFLOPS": "0.05", "FINETUNE_PRICE_PER_HOUR": "1",
        "TENSORBOARD_LOGGING_DIR": "/gcs/logs/ds-e2e", "FINETUNE_POOLS": "t4",
        "LOCAL_CHECKPOINT_DIR": "/local-checkpoints"}  # tiered saves: the dev stack's t4 pool has a local SSD
    assert json.loads(launch.env["FINETUNE_STACK_KEYS"])["--records"] == "workloads.ds-e2e.finetune.recordFormat"
    forwarded = set(nvidia.forwarded_env(w, where, False, launch))
    assert {"CHECKPOINT_DIR", "MODEL_DIR", "FINETUNE_PEAK_TFLOPS", "TENSORBOARD_LOGGING_DIR",
            "FINETUNE_STACK_KEYS", "FINETUNE_POOLS", "FINETUNE_ESTIMATE"} <= forwarded
    files = nvidia.config_map_data(w, where, False, launch)
    ds = json.loads(files["ds_config.json"])
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_param_persistence_threshold"] == "auto"
    assert ds["train_batch_size"] == 8 and "fp16" not in ds and "bf16" not in ds
    assert files["finetune.py"] == (ROOT / "recipes" / "finetune.py").read_text()
    assert files["finetune_render.py"] == (ROOT / "recipes" / "finetune_render.py").read_text()


def test_the_adapters_scenario_renders_the_stacks_server(e2e: ModuleType) -> None:
    """Two finetune workloads of the dev stack and their server, as the stack's own checks load them: each run
    exports an adapter, the server loads both on the base with vLLM's LoRA flags (issue 27 item 3), and a bucket
    folder's adapter trained elsewhere (issue 42 item 4)."""
    from workloads import finetune
    from workloads.serving_command import lora_args
    from workloads.serving_source import model_source

    m = e2e.adapters_stack()
    server = m.workloads["serve"]
    source = model_source(m, server)
    assert (source.ref, source.served_name) == ("/gcs-adapters/e2e-adapters/base", "e2e-adapters/base")
    # A bucket folder's adapter (trained with PEFT alone, rank 4) beside the stack's own two (rank 2): room for 8.
    assert lora_args(source) == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3", "--lora-modules",
                                 "no=/gcs-adapters/models/no", "yes=/gcs-adapters/models/yes",
                                 "e2e-peft=/gcs-adapters/e2e-adapters/peft-adapter"]
    args = finetune.script_args(m.workloads["no"])
    assert args[args.index("--lora-rank"):args.index("--lora-target-modules")] == [
        "--lora-rank", "2", "--lora-alpha", "32", "--lora-dropout", "0.05", "--lora-export", "adapter"]
    assert m.workloads["no"].checkpoint_dir == "/gcs-adapters/checkpoints/no"
    assert e2e.ADAPTER_SAVE_STEPS < e2e.ADAPTER_STEPS  # a checkpoint to stand in for the gated candidate


def test_the_adapters_scenario_runs_after_the_vertex_export_it_serves(e2e: ModuleType) -> None:
    assert e2e.with_needs(["adapters"]) == ["vertex", "adapters"]
    assert e2e.with_needs(["vertex", "adapters"]) == ["vertex", "adapters"]
    assert e2e.with_needs(["mpijob", "finetune"]) == ["mpijob", "finetune"]
    # On one side of the two clusters, vertex before adapters: the export is in that cluster's bucket.
    assert e2e.streams_of(e2e.with_needs(["adapters", "recovery"])) == [["recovery"], ["vertex", "adapters"]]


def test_the_held_out_task_is_not_trained_on(e2e: ModuleType) -> None:
    train, held = e2e.adapter_pairs()
    assert len(held) == e2e.TASK_RECORDS == 20 and len(train) == 44 and not set(train) & set(held)
    assert e2e.adapter_prompt(("two", "three")) == "Is two next to three?"
    assert e2e.SCENARIOS["adapters"] is e2e.scenario_adapters and "adapters" in e2e.DEFAULT_SCENARIOS


def test_progress_problems_judge_the_eta_at_half_way_against_the_time_left(e2e: ModuleType) -> None:
    final = {"progressPercentage": 100, "estimatedRemainingSeconds": 0, "elapsedSeconds": 100.0, "step": 40}
    # At step 20, 60 s in: 40 s were left. An ETA of 59 s is 47.5 % off (within 50 %), 61 s 52.5 % (not).
    half = {"progressPercentage": 50, "estimatedRemainingSeconds": 59, "elapsedSeconds": 60.0, "step": 20}
    assert e2e.progress_problems(half, final) == []
    late = {**half, "estimatedRemainingSeconds": 61}
    assert e2e.progress_problems(late, final) == [
        "ETA at step 20 (50 %): 61 s, but 40.0 s were left (more than 50% off)"]
    assert e2e.progress_problems(half, {**final, "progressPercentage": 97, "estimatedRemainingSeconds": 3}) == [
        "progress.json ends at 97 %, ETA 3 s: expected 100 % and 0 s"]
    assert e2e.progress_problems(None, final) == ["no ETA read at half-way (None)"]


def test_event_problems_name_each_missing_scalar(e2e: ModuleType) -> None:
    assert e2e.event_problems({"train/loss", "train/tokens_per_second", "train/mfu", "train/epoch"}) == []
    assert e2e.event_problems({"train/loss"}) == ["the TensorBoard event files have no train/tokens_per_second",
                                                  "the TensorBoard event files have no train/mfu"]


def test_the_second_start_must_reuse_the_tokenized_data(e2e: ModuleType) -> None:
    """Issue 31 item 2: the launcher tokenizes once on the first start, its ranks and the whole second start reuse
    that one folder; a second start that tokenizes again fails the scenario."""
    folder = "/gcs/checkpoints/ds-e2e/tokenized/0123456789abcdef"
    made = f"[finetune] tokenized 56 records in 0.4 s (56 samples, 3412 tokens, 8,530 tokens/s) into {folder}\n"
    reused = f"[finetune] tokenized data reused from {folder} (56 samples, 3412 tokens, off; made ... in 0.4 s)\n"
    assert e2e.tokenized_problems(made + reused, reused) == []
    again = e2e.tokenized_problems(made + reused, made + reused)
    assert again == ["the second start tokenized the data again (1 times): expected it reused"]
    other = reused.replace("0123456789abcdef", "fedcba9876543210")
    assert e2e.tokenized_problems(made + reused, other)[0].startswith("folders reused")
    assert e2e.tokenized_problems(reused, reused)[0].startswith("the first start tokenized the data 0 times")


def test_the_vertex_scenario_requires_text_packed_into_full_blocks(e2e: ModuleType) -> None:
    """Issue 31 item 2 in make e2e: 950 tokens in 32-token blocks are 30 samples (29 full, the last 22 tokens), one
    epoch of 2 ranks x 4 a step is 4 steps; unpacked (one document a sample) it fails."""
    assert e2e.packed_steps({"packing": "blocks", "samples": 30, "tokens": 950}) == 4
    with pytest.raises(RuntimeError, match="not packed into 32-token blocks"):
        e2e.packed_steps({"packing": "off", "samples": 64, "tokens": 950})
    with pytest.raises(RuntimeError, match="not packed"):
        e2e.packed_steps({"packing": "blocks", "samples": 64, "tokens": 950})


def test_the_run_record_check_allows_the_two_roundings_only(e2e: ModuleType) -> None:
    """The flake: the record rounds the cost from the unrounded hours (0.003349.. h x $1 = 0.0033) and the hours
    to 6 places (0.00335); recomputing the cost from the rounded hours (0.0034) failed 1 run in 5. Within the two
    roundings it passes; a cost off by more than they allow fails."""
    estimate = {"estimate": {}, "tokensPerSecondPerGpu": 450.0, "mfu": 0.005}
    ok = {"cost": 0.0033, "trainingHours": 0.00335, "step": 40, **estimate}
    assert e2e.run_record_problems(ok, 40, 1.0) == []
    assert e2e.run_record_problems({**ok, "cost": 0.0035}, 40, 1.0)  # 0.00015 off: more than rounding
    assert e2e.run_record_problems({**ok, "step": 39}, 40, 1.0)
    assert e2e.run_record_problems({"cost": 0.0033, "trainingHours": 0.00335, "step": 40}, 40, 1.0) == [
        "run.json lacks estimate, tokensPerSecondPerGpu, mfu (the estimate beside the measured run)"]


def test_the_e2e_estimate_rests_on_the_cpu_rows_and_counts_its_saves(e2e: ModuleType) -> None:
    """The finetune scenario's estimate: maxSteps 30 x (2 ranks x micro batch 4) x 96 tokens = 23,040 tokens at the
    CPU rows' 227..273 tokens/s per GPU: 23,040 / (2 x 273) / 3600 = 0.01172 h .. 0.01410 h, plus 6 saves."""
    w, _where, _launch = e2e.finetune_workload()
    est = e2e.e2e_estimate(w)
    assert est["evidence"] == ["ours-e2e-tiny-llama-lora-cpu-q1", "ours-e2e-tiny-llama-lora-cpu-q3"]
    assert est["tokensPerSecondPerGpu"] == {"low": 227.0, "high": 273.0}
    assert est["trainingHours"] == pytest.approx({"fast": 23040 / (2 * 273) / 3600,
                                                  "slow": 23040 / (2 * 227) / 3600}, abs=1e-6)
    saves = est["hours"]["fast"] - est["trainingHours"]["fast"]
    assert saves > 0  # 30 // saveSteps 5 = 6 saves, each the adapter's checkpoint over the bucket's write rate
    assert est["cost"]["slow"] == pytest.approx(est["hours"]["slow"] * 1.0, abs=1e-4)


def test_the_scenarios_split_over_two_clusters_in_the_order_asked(e2e: ModuleType) -> None:
    assert e2e.streams_of(["mpijob", "vertex", "recovery", "finetune", "adapters"]) == [
        ["mpijob", "recovery", "finetune"], ["vertex", "adapters"]]
    assert e2e.streams_of(["finetune", "mpijob"]) == [["finetune", "mpijob"]]  # one side only: one cluster
    assert e2e.streams_of(["adapters"]) == [["adapters"]]
    every = [name for stream in e2e.STREAMS for name in stream]
    assert sorted(every) == sorted(e2e.DEFAULT_SCENARIOS) == sorted(e2e.SCENARIOS)


def _tiered(tmp_path: Path, nodes: list[int], complete: bool) -> Path:
    folder = tmp_path / "bucket" / "checkpoint-10"
    folder.mkdir(parents=True)
    for node in nodes:
        (folder / f"copied-node-{node}.json").write_text("{}")
    if complete:
        (folder / "checkpoint-copied.json").write_text("{}")
    return tmp_path / "bucket"


def test_a_copy_under_way_at_the_stop_is_dropped_or_finished_whole(e2e: ModuleType, tmp_path: Path) -> None:
    ft = e2e._finetune_script()
    local = {"w0": tmp_path / "w0", "w1": tmp_path / "w1"}
    for folder in local.values():
        (folder / "checkpoint-12").mkdir(parents=True)
        (folder / "checkpoint-12" / "trainer_state.json").write_text("{}")  # the Trainer's last write of a save
    dropped = "[finetune] copy of checkpoint-10 abandoned: stopping, and checkpoint-12 is newer"
    # Dropped for the stop's save, and not marked: right. Dropped but marked: wrong.
    assert e2e.tiered_problems(ft, local, _tiered(tmp_path / "a", [0], False), 12, 10, dropped) == []
    assert e2e.tiered_problems(ft, local, _tiered(tmp_path / "b", [0, 1], True), 12, 10, dropped) == [
        "checkpoint-10, cut short by the stop, is marked complete"]
    # Finished before the ranks reached their save (a loaded machine): whole on both nodes, or it is wrong.
    assert e2e.tiered_problems(ft, local, _tiered(tmp_path / "c", [0, 1], True), 12, 10, "") == []
    half = e2e.tiered_problems(ft, local, _tiered(tmp_path / "d", [0], True), 12, 10, "")
    assert half == ["the copy of checkpoint-10 under way at the stop was neither dropped for the stop's save nor "
                    "finished on every node"]
    assert e2e.tiered_problems(ft, local, _tiered(tmp_path / "e", [0], False), 12, 10, "") == half
    # A worker whose local disk lacks the stop's save.
    (local["w1"] / "checkpoint-12" / "trainer_state.json").unlink()
    assert e2e.tiered_problems(ft, local, _tiered(tmp_path / "f", [0, 1], True), 12, 10, "") == [
        "w1's local disk lacks checkpoint-12"]
