"""recipes/finetune.py's plain-Python parts (torch, transformers, peft, datasets and deepspeed are only
imported inside its run functions, which `make e2e` runs and tests/test_finetune_run.py runs under stand-ins):
arguments and environment, the ds_config.json it reads, data-format detection, prompt/response samples, the newest
checkpoint, the completion marker, and the LoRA/ZeRO/precision combinations it refuses."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from recipes import finetune_args as fa
from recipes import finetune_config as fc
from recipes import finetune_data as fd
from recipes import finetune_export as fe

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "recipes" / "finetune.py"
BASE = ["--model", "m", "--dataset", "d", "--checkpoint-dir", "/c", "--model-dir", "/m"]


@pytest.fixture(scope="module")
def ft() -> ModuleType:
    """finetune.py as the cluster imports it: its modules (finetune_*.py) found beside it."""
    from workloads.finetune import script_module

    return script_module("finetune")


@pytest.fixture(scope="module")
def rd() -> ModuleType:
    from workloads.finetune import script_module

    return script_module("finetune_render")


@pytest.fixture(scope="module")
def ck() -> ModuleType:
    from workloads.finetune import script_module

    return script_module("finetune_checkpoints")


def test_no_heavy_import_at_module_level(ft: ModuleType) -> None:
    for heavy in ("torch", "transformers", "peft", "datasets", "deepspeed", "accelerate"):
        assert not hasattr(ft, heavy)
    top = [line for line in SCRIPT.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in top if any(h in line for h in ("torch", "transformers", "peft", "datasets"))]


# --- arguments and environment --------------------------------------------------------------------------------

def test_environment_fills_what_the_arguments_leave_out(ft: ModuleType) -> None:
    env = {"FINETUNE_MODEL": "meta-llama/Llama-3.1-8B", "FINETUNE_DATASET": "/gcs/b/data",
           "CHECKPOINT_DIR": "/gcs/b/checkpoints/ft", "MODEL_DIR": "/gcs/b/models/ft", "CHECKPOINT_EVERY_STEPS": "50"}
    args = ft.parse_args([], env)
    assert (args.model, args.dataset, args.checkpoint_dir, args.model_dir, args.save_steps) == (
        "meta-llama/Llama-3.1-8B", "/gcs/b/data", "/gcs/b/checkpoints/ft", "/gcs/b/models/ft", 50)


def test_an_argument_wins_over_its_environment_variable(ft: ModuleType) -> None:
    args = ft.parse_args(["--model", "./mine", "--save-steps", "7", *BASE[2:]],
                         {"FINETUNE_MODEL": "other", "CHECKPOINT_EVERY_STEPS": "50"})
    assert args.model == "./mine" and args.save_steps == 7


def test_on_vertex_ai_the_outputs_go_where_the_customjob_says(ft: ModuleType) -> None:
    """Vertex AI sets AIP_CHECKPOINT_DIR and AIP_MODEL_DIR as gs:// URIs; the job sees the bucket at /gcs/BUCKET."""
    vertex = {"AIP_CHECKPOINT_DIR": "gs://bkt/vertex/checkpoints/", "AIP_MODEL_DIR": "gs://bkt/vertex/model/"}
    args = ft.parse_args(BASE[:4], vertex)
    assert (args.checkpoint_dir, args.model_dir) == ("/gcs/bkt/vertex/checkpoints/", "/gcs/bkt/vertex/model/")
    # The stack's own variable, then the argument, win over Vertex AI's.
    args = ft.parse_args([*BASE[:4], "--model-dir", "/out"], {**vertex, "CHECKPOINT_DIR": "/ckpt"})
    assert (args.checkpoint_dir, args.model_dir) == ("/ckpt", "/out")


def test_tensorboards_folder_on_gke_and_on_vertex_ai(ft: ModuleType) -> None:
    assert fa.tensorboard_dir({}) is None
    assert fa.tensorboard_dir({"AIP_TENSORBOARD_LOG_DIR": "gs://bkt/vertex/logs/"}) == "/gcs/bkt/vertex/logs/"
    assert fa.tensorboard_dir({"AIP_TENSORBOARD_LOG_DIR": "gs://bkt/vertex/logs/",
                               "TENSORBOARD_LOGGING_DIR": "/gcs/logs/tune"}) == "/gcs/logs/tune"


def test_defaults(ft: ModuleType) -> None:
    args = ft.parse_args(BASE, {})
    assert (args.save_steps, args.seq_len, args.learning_rate, args.lora, args.format, args.records) == (
        200, 2048, 2e-5, False, "auto", "auto")
    # The field names: the record format's own unless given (fd.layout).
    assert args.text_field is None and args.prompt_field is None and args.messages_field is None
    assert (args.chat_template, args.eval_split, args.roles, args.check_data) == ("auto", None, [], False)
    assert args.epochs is None and args.max_steps is None and args.precision is None and args.deepspeed is None


def test_the_launchers_deepspeed_config_and_local_rank_are_understood(ft: ModuleType) -> None:
    # The MPIJob's and the chart's launch lines pass --deepspeed_config; DeepSpeed's launcher adds --local_rank=N.
    args = ft.parse_args([*BASE, "--deepspeed_config", "/etc/deepspeed/ds_config.json", "--local_rank=1"], {})
    assert args.deepspeed == "/etc/deepspeed/ds_config.json" and args.local_rank == 1
    assert ft.parse_args([*BASE, "--deepspeed", "ds.json"], {}).deepspeed == "ds.json"


def test_every_problem_is_reported_at_once(ft: ModuleType) -> None:
    with pytest.raises(ft.UsageError) as caught:
        ft.parse_args(["--prompt-field", "q", "--epochs", "1", "--max-steps", "5", "--seq-len", "4",
                       "--learning-rate", "0", "--lora", "--lora-rank", "0", "--lora-dropout", "1"], {})
    text = str(caught.value)
    for expected in ("--model (or FINETUNE_MODEL) is required", "--dataset (or FINETUNE_DATASET) is required",
                     "--checkpoint-dir (or CHECKPOINT_DIR or AIP_CHECKPOINT_DIR) is required",
                     "--model-dir (or MODEL_DIR or AIP_MODEL_DIR) is required",
                     "--prompt-field and --response-field go together", "give --epochs or --max-steps, not both",
                     "--seq-len must be 8 or more, got 4", "--learning-rate must be more than 0, got 0.0",
                     "--lora-rank must be 1 or more, got 0", "--lora-dropout must be less than 1, got 1.0"):
        assert expected in text


def test_a_bad_checkpoint_interval_in_the_environment_is_named(ft: ModuleType) -> None:
    with pytest.raises(ft.UsageError, match=r"CHECKPOINT_EVERY_STEPS='ten': expected a whole number"):
        ft.parse_args(BASE, {"CHECKPOINT_EVERY_STEPS": "ten"})


def test_lora_settings_are_checked_only_with_lora(ft: ModuleType) -> None:
    assert ft.parse_args([*BASE, "--lora-rank", "0"], {}).lora_rank == 0
    lora = [*BASE, "--lora", "--lora-rank", "8", "--lora-alpha", "16", "--lora-target-modules"]
    assert ft.parse_args([*lora, "q_proj", "v_proj"], {}).lora_rank == 8
    with pytest.raises(ft.UsageError) as caught:
        ft.parse_args([*lora[:-3], "--lora-alpha", "0", "--lora-target-modules", " "], {})
    assert str(caught.value) == ("--lora-alpha must be more than 0, got 0.0; "
                                 "--lora-target-modules needs module names (or all-linear)")


def test_the_token_comes_from_the_file_hf_token_path_names(ft: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("hf_secret\n")
    assert ft.hf_token({"HF_TOKEN_PATH": str(tmp_path / "token"), "HF_TOKEN": "ignored"}) == "hf_secret"
    assert ft.hf_token({"HF_TOKEN": "an env value is never read"}) is None
    with pytest.raises(ft.UsageError, match="cannot read the token file"):
        ft.hf_token({"HF_TOKEN_PATH": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(ft.UsageError, match="the token file is empty"):
        ft.hf_token({"HF_TOKEN_PATH": str(tmp_path / "empty")})


# --- ds_config.json, precision and combinations ---------------------------------------------------------------

STACK_DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}


def test_trainer_arguments_match_the_concrete_ds_config_values(ft: ModuleType) -> None:
    assert fc.trainer_ds_args(STACK_DS, "bf16") == {"bf16": True, "fp16": False, "per_device_train_batch_size": 4,
                                                    "gradient_accumulation_steps": 2, "max_grad_norm": 1.0}
    auto = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "fp16": {"enabled": "auto"}}
    assert fc.trainer_ds_args(auto, "fp32") == {"bf16": False, "fp16": False}
    assert fc.trainer_ds_args(None, "fp16") == {"bf16": False, "fp16": True}


def test_precision_comes_from_ds_config_and_must_agree(ft: ModuleType) -> None:
    assert fc.resolve_precision(None, STACK_DS) == "bf16"
    assert fc.resolve_precision(None, {"fp16": {"enabled": True}}) == "fp16"
    assert fc.resolve_precision(None, {"zero_optimization": {"stage": 2}}) == "fp32"
    assert fc.resolve_precision("bf16", {"bf16": {"enabled": "auto"}}) == "bf16"
    assert fc.resolve_precision(None, None) == "fp32"
    with pytest.raises(ft.UsageError, match=re.escape("--precision fp16 but ds_config.json trains in bf16")):
        fc.resolve_precision("fp16", STACK_DS)
    with pytest.raises(ft.UsageError, match=re.escape("--precision bf16 but ds_config.json trains in fp32")):
        fc.resolve_precision("bf16", {"zero_optimization": {"stage": 0}})


def test_zero3_gathers_the_weights_when_saving(ft: ModuleType) -> None:
    prepared = fc.prepared_ds_config({"zero_optimization": {"stage": 3,
                                                            "stage3_gather_16bit_weights_on_model_save": False}})
    assert prepared["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert fc.prepared_ds_config({"zero_optimization": {"stage": 2}}) == {"zero_optimization": {"stage": 2}}
    assert fc.prepared_ds_config(None) is None


def test_zero_stage_is_read_and_checked(ft: ModuleType) -> None:
    assert fc.zero_stage(STACK_DS) == 3 and fc.zero_stage(None) == 0 and fc.zero_stage({}) == 0
    with pytest.raises(ft.UsageError, match=re.escape("zero_optimization.stage must be 0-3, got 4")):
        fc.zero_stage({"zero_optimization": {"stage": 4}})


def test_the_combinations_the_script_cannot_run(ft: ModuleType) -> None:
    assert fc.combination_problems(lora=True, stage=3, precision="bf16", cpu=False) == []
    assert fc.combination_problems(lora=False, stage=3, precision="fp32", cpu=True) == []
    assert fc.combination_problems(lora=False, stage=2, precision="fp16", cpu=True) == [
        "fp16 does not run on CPUs (DeepSpeed's CPU accelerator has no fp16): use bf16 or fp32"]
    assert fc.combination_problems(lora=True, stage=3, precision="bf16", cpu=False, offload_params=True) == [
        "LoRA with ZeRO-3 parameter offload (offload_param) is not supported: offload the optimizer only, or "
        "train without LoRA"]
    assert fc.combination_problems(lora=False, stage=3, precision="bf16", cpu=False, offload_params=True) == []
    assert fc.offloads_params({"zero_optimization": {"offload_param": {"device": "cpu"}}}) is True
    assert fc.offloads_params({"zero_optimization": {"offload_param": {"device": "none"}}}) is False
    assert fc.offloads_params(None) is False


def test_ds_config_file_errors_are_usage_errors(ft: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "ok.json").write_text(json.dumps(STACK_DS))
    assert fc.load_ds_config(str(tmp_path / "ok.json")) == STACK_DS
    assert fc.load_ds_config(None) is None
    for name, message in (("bad.json", "not JSON"), ("list.json", "expected a JSON object"),
                          ("missing.json", "No such file")):
        with pytest.raises(ft.UsageError, match=message):
            fc.load_ds_config(str(tmp_path / name))


# --- data ------------------------------------------------------------------------------------------------------

def test_a_files_format_is_read_from_its_suffix(ft: ModuleType, tmp_path: Path) -> None:
    for name, loader in (("a.jsonl", "json"), ("a.json", "json"), ("a.parquet", "parquet"), ("a.txt", "text")):
        (tmp_path / name).write_text("")
        assert fd.data_source(str(tmp_path / name)) == fd.DataSource(loader, (str(tmp_path / name),))
    (tmp_path / "a.csv").write_text("")
    with pytest.raises(ft.UsageError, match=r"unknown suffix '.csv': give --format \(jsonl, parquet, text\)"):
        fd.data_source(str(tmp_path / "a.csv"))
    assert fd.data_source(str(tmp_path / "a.csv"), "text").loader == "text"


def test_a_folders_files_decide_its_format(ft: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "part").mkdir()
    for name in ("b.jsonl", "part/a.jsonl", "README.md", ".hidden.jsonl"):
        (tmp_path / name).write_text("")
    source = fd.data_source(str(tmp_path))
    assert source == fd.DataSource("json", (str(tmp_path / "b.jsonl"), str(tmp_path / "part" / "a.jsonl")))
    (tmp_path / "c.parquet").write_text("")
    with pytest.raises(ft.UsageError, match=r"mixes formats \(jsonl, parquet\)"):
        fd.data_source(str(tmp_path))
    assert fd.data_source(str(tmp_path), "parquet") == fd.DataSource("parquet", (str(tmp_path / "c.parquet"),))
    with pytest.raises(ft.UsageError, match=r"no text files in the folder \(found jsonl, parquet\)"):
        fd.data_source(str(tmp_path), "text")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ft.UsageError, match=re.escape("no .jsonl, .json, .parquet, .txt, .text files")):
        fd.data_source(str(tmp_path / "empty"))


def test_a_dataset_id_goes_to_the_hub_and_a_missing_path_is_refused(ft: ModuleType, tmp_path: Path) -> None:
    assert fd.data_source("tatsu-lab/alpaca") == fd.DataSource("hub", hub_id="tatsu-lab/alpaca")
    assert fd.data_source("imdb") == fd.DataSource("hub", hub_id="imdb")
    for missing in (str(tmp_path / "nothing.jsonl"), "./no-such-folder", "a/b/c"):
        with pytest.raises(ft.UsageError, match="no such file or folder"):
            fd.data_source(missing)


def test_prompt_and_response_make_one_sample_learning_the_response(rd: ModuleType) -> None:
    assert rd.build_example([1, 5, 6], [7, 8], eos_id=2, seq_len=16) == {
        "input_ids": [1, 5, 6, 7, 8, 2], "attention_mask": [1] * 6, "labels": [-100, -100, -100, 7, 8, 2]}
    assert rd.build_example([1, 5, 6], [7, 8], eos_id=2, seq_len=4)["labels"] == [-100, -100, -100, 7]
    assert rd.build_example([], [9, 9, 9], eos_id=None, seq_len=2) == {
        "input_ids": [9, 9], "attention_mask": [1, 1], "labels": [9, 9]}
    assert rd.build_example([1, 5], [7], eos_id=2, seq_len=8, mask_prompt=False)["labels"] == [1, 5, 7, 2]


def test_a_sample_with_nothing_to_learn_is_dropped(rd: ModuleType) -> None:
    cut = rd.build_example([1, 2, 3, 4], [7], eos_id=2, seq_len=4)
    assert rd.learns_something(cut) is False
    assert rd.learns_something(rd.build_example([1], [7], eos_id=2, seq_len=4)) is True
    # Causal models shift labels by one: the first label is never predicted.
    assert rd.learns_something({"labels": [5, -100]}) is False


def test_batches_are_right_padded_and_the_padding_masked(rd: ModuleType) -> None:
    a = rd.build_example([1], [5, 6], eos_id=2, seq_len=8)
    b = rd.build_example([], [7], eos_id=2, seq_len=8)
    assert rd.pad_batch([a, b], pad_id=0) == {
        "input_ids": [[1, 5, 6, 2], [7, 2, 0, 0]],
        "attention_mask": [[1, 1, 1, 1], [1, 1, 0, 0]],
        "labels": [[-100, 5, 6, 2], [7, 2, -100, -100]]}


# --- checkpoints and the marker --------------------------------------------------------------------------------

def test_the_newest_complete_checkpoint_is_chosen(ck: ModuleType, tmp_path: Path) -> None:
    assert ck.newest_checkpoint(tmp_path / "absent") is None
    assert ck.newest_checkpoint(tmp_path) is None
    for step, complete in ((5, True), (10, True), (9, True), (15, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-99").write_text("a file, not a folder")
    # 10 beats 9 by number (not by name: "checkpoint-9" > "checkpoint-10" as text); 15 was cut off while saving.
    assert ck.newest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    assert ck.checkpoint_step("checkpoint-42") == 42 and ck.checkpoint_step("checkpoint-42-tmp") is None


def test_the_marker_says_the_step_and_the_model(ft: ModuleType) -> None:
    when = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
    text = fe.marker_text(40, "meta-llama/Llama-3.1-8B", lora=True, dataset="/gcs/b/data", precision="bf16",
                          world_size=16, finished=when, export="merged")
    assert text.endswith("\n")
    assert json.loads(text) == {"step": 40, "model": "meta-llama/Llama-3.1-8B", "lora": True, "dataset": "/gcs/b/data",
                                "precision": "bf16", "world_size": 16, "finished": "2026-11-23T12:00:00+00:00",
                                "export": "merged"}
    # An adapter's marker says so, with its rank and (as `model`) its base: what the server's wait checks.
    adapter = json.loads(fe.marker_text(40, "org/base", lora=True, dataset="d", precision="bf16", world_size=1,
                                        finished=when, export="adapter", lora_rank=16))
    assert (adapter["export"], adapter["lora_rank"], adapter["model"]) == ("adapter", 16, "org/base")
    # The text the server's init container greps for (json.dumps' default separators).
    assert '"export": "adapter"' in fe.marker_text(1, "m", lora=True, dataset="d", precision="bf16", world_size=1,
                                                     finished=when, export="adapter")


def test_the_marker_says_how_the_records_were_rendered(ft: ModuleType) -> None:
    """Issue 36 item 1: what evaluate.py renders the held-out task with, without being told."""
    from recipes.finetune_check import plan
    from recipes.finetune_data import FieldSpec

    chat = plan({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, FieldSpec(),
                "auto", "{{ messages }}", None)
    raw = plan({"prompt": "q", "completion": "a"}, FieldSpec(), "raw", "{{ messages }}", None)
    assert fe.marker_rendering(chat, "auto") == {"rendering": "chat", "chatTemplate": "auto",
                                                 "recordFormat": "messages"}
    assert fe.marker_rendering(raw, "raw") == {"rendering": "raw", "chatTemplate": "raw",
                                               "recordFormat": "prompt-completion"}
    when = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
    marker = json.loads(fe.marker_text(1, "m", lora=True, dataset="d", precision="bf16", world_size=1, finished=when,
                                       export="adapter", rendering=fe.marker_rendering(chat, "auto")))
    assert (marker["rendering"], marker["recordFormat"]) == ("chat", "messages")


def test_what_the_export_holds(ft: ModuleType) -> None:
    assert [fe.export_kind(False, "adapter"), fe.export_kind(True, "adapter"), fe.export_kind(True, "merged")] == [
        "full", "adapter", "merged"]
    assert fa.build_parser().parse_args([]).lora_export == "adapter"


def test_output_survives_a_closed_pipe(ft: ModuleType) -> None:
    class Closed:
        encoding = "utf-8"

        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    stream = ft.ForgivingStream(Closed())
    assert stream.write("{'loss': 1.0}\n") == 14
    stream.flush()
    assert stream.encoding == "utf-8"


def test_sigterm_is_recorded_not_acted_on(ft: ModuleType) -> None:
    stop = ft.StopRequest()
    assert stop.signal is None
    stop(15, None)
    assert stop.signal == 15


def test_cpu_runs_are_recognised(ft: ModuleType) -> None:
    assert fc.cpu_run({"DS_ACCELERATOR": "cpu"}) and fc.cpu_run({"DS_ACCELERATOR": " CPU "})
    assert not fc.cpu_run({}) and not fc.cpu_run({"DS_ACCELERATOR": "cuda"})


def test_main_refuses_bad_input_before_importing_anything(ft: ModuleType, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    (tmp_path / "data.jsonl").write_text("{}\n")
    code = ft.main(["--model", "m", "--dataset", str(tmp_path / "data.jsonl"), "--checkpoint-dir", "/c",
                    "--model-dir", "/m", "--precision", "fp16"])
    assert code == ft.EXIT_USAGE
    assert "FAILED: fp16 does not run on CPUs" in capsys.readouterr().out


# --- packing and the tokenized data's fingerprint (finetune_tokenized.py, issue 31 item 2) -----------------------

@pytest.fixture(scope="module")
def tk() -> ModuleType:
    from workloads.finetune import script_module

    return script_module("finetune_tokenized")


def test_documents_are_packed_end_to_end_into_full_blocks(tk: ModuleType) -> None:
    documents = [[1, 10, 11, 2], [1, 20, 21, 22, 23, 24, 25, 2], [1, 2], [1, 30, 2]]
    blocks = list(tk.pack_blocks(documents, 5))
    assert blocks == [[1, 10, 11, 2, 1], [20, 21, 22, 23, 24], [25, 2, 1, 2, 1], [30, 2]]
    assert list(tk.pack_blocks([[1, 2, 3], [4, 5, 6]], 3)) == [[1, 2, 3], [4, 5, 6]]  # no empty last block
    # A document longer than two blocks: cut into as many, its tail in the last.
    assert list(tk.pack_blocks([list(range(12))], 5)) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert list(tk.pack_blocks([], 4)) == []


@pytest.mark.parametrize(("flag", "kind", "packing"), [
    ("auto", "text", "blocks"), ("on", "text", "blocks"), ("off", "text", "off"),
    ("auto", "chat", "off"), ("auto", "plain", "off"), ("on", "chat", "padding-free"), ("on", "plain", "padding-free"),
    ("off", "chat", "off")])
def test_packing_is_blocks_for_text_and_padding_free_for_chat_only_when_asked(tk: ModuleType, flag: str, kind: str,
                                                                               packing: str) -> None:
    assert tk.packing_for(flag, kind) == packing


def test_a_changed_file_or_setting_is_a_new_fingerprint(tk: ModuleType, tmp_path: Path) -> None:
    from workloads.finetune import script_module

    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    source = script_module("finetune_data").data_source(str(data))
    parts = {"data": tk.source_identity(source), "seqLen": 2048, "packing": "blocks"}
    same = {"data": tk.source_identity(source), "packing": "blocks", "seqLen": 2048}
    assert tk.fingerprint(parts) == tk.fingerprint(same) and len(tk.fingerprint(parts)) == 16
    assert tk.fingerprint({**parts, "seqLen": 4096}) != tk.fingerprint(parts)
    assert tk.fingerprint({**parts, "packing": "off"}) != tk.fingerprint(parts)
    data.write_text('{"text": "ab"}\n')  # rewritten in place: another size (and time)
    assert tk.fingerprint({**parts, "data": tk.source_identity(source)}) != tk.fingerprint(parts)


def test_the_tokenizer_is_named_by_its_whole_tokenizer_json_and_template(tk: ModuleType) -> None:
    class Backend:
        def __init__(self, text: str) -> None:
            self.text = text

        def to_str(self) -> str:
            return self.text

    def tokenizer(vocab: str, template: str | None = None) -> object:
        return type("T", (), {"backend_tokenizer": Backend(vocab), "chat_template": template, "eos_token_id": 2})()

    assert tk.tokenizer_identity(tokenizer("v1")) == tk.tokenizer_identity(tokenizer("v1"))
    assert tk.tokenizer_identity(tokenizer("v2")) != tk.tokenizer_identity(tokenizer("v1"))
    assert tk.tokenizer_identity(tokenizer("v1", "{{ x }}")) != tk.tokenizer_identity(tokenizer("v1"))


def test_a_folder_without_its_marker_is_not_complete(tk: ModuleType, tmp_path: Path) -> None:
    assert tk.read_marker(tmp_path) is None
    (tmp_path / tk.MARKER_FILE).write_text("{cut off")
    assert tk.read_marker(tmp_path) is None
    made = datetime.datetime(2026, 11, 27, 13, 0, tzinfo=datetime.UTC)
    (tmp_path / tk.MARKER_FILE).write_text(tk.tokenized_marker_text({"samples": 3, "tokens": 48, "packing": "blocks"},
                                                                    seconds=1.25, parts={"seqLen": 16}, made=made))
    assert tk.read_marker(tmp_path) == {"samples": 3, "tokens": 48, "packing": "blocks", "seconds": 1.2,
                                        "made": "2026-11-27T13:00:00+00:00", "from": {"seqLen": 16}}


def _stamp_inputs(tmp_path: Path) -> tuple[object, list[object], Path]:
    """A launcher's data step inputs: a model folder with tokenizer files, a data file, the step's arguments."""
    import argparse

    from workloads.finetune import script_module

    model, data = tmp_path / "model", tmp_path / "train.jsonl"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    data.write_text('{"text": "a"}\n')
    args = argparse.Namespace(model=str(model), dataset=str(data), seq_len=2048, tokenized_dir=str(tmp_path / "tok"),
                              checkpoint_dir=str(tmp_path / "ckpt"), prepare_data=True)
    return args, [script_module("finetune_data").data_source(str(data))], model


def test_the_launchers_stamp_changes_with_any_file_or_flag_it_can_see(tk: ModuleType, tmp_path: Path) -> None:
    import os

    args, sources, model = _stamp_inputs(tmp_path)
    stamp = tk.launcher_stamp(args, sources)
    assert stamp is not None and stamp == tk.launcher_stamp(args, sources) and len(stamp) == 16
    (model / "model.safetensors").write_text("other weights")  # not the tokenizer's: the same tokens
    assert tk.launcher_stamp(args, sources) == stamp
    (model / "tokenizer.json").write_text('{"v": 2}')
    assert tk.launcher_stamp(args, sources) != stamp
    stamp = tk.launcher_stamp(args, sources)
    assert tk.launcher_stamp(type(args)(**{**vars(args), "seq_len": 4096}), sources) != stamp
    config = tmp_path / "ds_config.json"  # a new pod's ConfigMap: a new file, the same flag, the same stamp
    config.write_text("{}")
    with_config = type(args)(**{**vars(args), "deepspeed": str(config)})
    stamp = tk.launcher_stamp(with_config, sources)
    config.write_text("{ }")
    assert tk.launcher_stamp(with_config, sources) == stamp
    template = tmp_path / "zephyr.jinja"  # a template file's text decides the tokens
    template.write_text("{{ messages }}")
    with_template = type(args)(**{**vars(args), "chat_template": str(template)})
    stamp = tk.launcher_stamp(with_template, sources)
    template.write_text("{{ messages }}\n")
    assert tk.launcher_stamp(with_template, sources) != stamp
    stamp = tk.launcher_stamp(args, sources)
    data = Path(args.dataset)
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1))  # rewritten, the same size
    assert tk.launcher_stamp(args, sources) != stamp
    # A hub model's tokenizer is not on disk to look at: no stamp, the whole step each time.
    assert tk.launcher_stamp(type(args)(**{**vars(args), "model": "Qwen/Qwen2.5-7B-Instruct"}), sources) is None


def test_a_stamp_names_a_complete_folder_only(tk: ModuleType, tmp_path: Path) -> None:
    root, folder = tmp_path / "tok", tmp_path / "tok" / "abc"
    folder.mkdir(parents=True)
    assert tk.stamped_folder(root, "s1") is None and tk.stamped_folder(root, None) is None
    tk.write_stamp(root, "s1", folder)
    assert tk.stamped_folder(root, "s1") is None  # the folder lost its marker (cut off): not reused
    made = datetime.datetime(2026, 11, 29, 13, 0, tzinfo=datetime.UTC)
    (folder / tk.MARKER_FILE).write_text(tk.tokenized_marker_text({"samples": 3}, seconds=1.0, parts={}, made=made))
    assert tk.stamped_folder(root, "s1") == (folder, tk.read_marker(folder))
    tk.write_stamp(root, None, folder)  # no stamp (a hub model): nothing written
    assert sorted(p.name for p in (root / tk.STAMPS_FOLDER).iterdir()) == ["s1"]


def test_a_restarts_data_step_reuses_the_stamped_folder_without_the_tokenizer(tk: ModuleType, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The launcher's --prepare-data after a preemption: the stamp of the same inputs names the complete folder,
    so neither the data check nor the tokenizer (transformers) runs."""
    from recipes import finetune_prepare as fp

    args, sources, _ = _stamp_inputs(tmp_path)
    run = type("Run", (), {"args": args, "source": sources[0], "held_out_source": None})()
    root = Path(args.tokenized_dir)
    folder = root / "f00d"
    folder.mkdir(parents=True)
    made = datetime.datetime(2026, 11, 29, 13, 0, tzinfo=datetime.UTC)
    (folder / tk.MARKER_FILE).write_text(tk.tokenized_marker_text({"samples": 3, "tokens": 48, "packing": "blocks"},
                                                                  seconds=1.0, parts={}, made=made))

    def checked(*_a: object) -> None:
        raise AssertionError("the data check ran")

    monkeypatch.setattr(fp, "check_data", checked)
    with pytest.raises(AssertionError, match="the data check ran"):  # no stamp yet: the whole step
        fp.prepare_data(run, None, fc.StackKeys({}))
    fp.write_stamp(root, fp.launcher_stamp(args, sources), folder)
    assert fp.prepare_data(run, None, fc.StackKeys({})) == 0
    assert f"tokenized data reused from {folder} (3 samples, 48 tokens, blocks;" in capsys.readouterr().out


# --- the data step's processes (finetune_tokenized.py data_procs, issue 37 item 4) ---------------------------------

@pytest.mark.parametrize(("affinity", "cpu_max", "cpus", "procs"), [
    (1, None, 1, 1),  # one CPU: one process (datasets' map in this process, num_proc None)
    (0, None, 1, 1),  # an affinity that says nothing: still one
    (208, "max 100000", 208, 64),  # no CPU limit: every CPU it may run on, at most MAX_DATA_PROCS
    (208, "20600000 100000", 206, 64),  # a3-megagpu-8g's worker container: 206 CPUs
    (48, "4600000 100000", 46, 46),  # g2-standard-48's: 46 processes
    (8, "150000 100000", 1, 1),  # a limit of 1.5 CPUs: 1
    (8, "50000 100000", 1, 1),  # half a CPU: still 1
    (16, "garbage", 16, 16),  # an unreadable limit: the affinity
])
def test_the_data_step_runs_one_process_a_usable_cpu(tk: ModuleType, affinity: int, cpu_max: str | None,
                                                      cpus: int, procs: int) -> None:
    assert tk.usable_cpus(affinity, cpu_max) == cpus
    assert tk.data_procs(cpus) == procs
    assert tk.MAX_DATA_PROCS == 64
