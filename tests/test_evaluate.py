"""recipes/evaluate.py (issue 27 item 4): the held-out task's checks, lm-eval's local task, the gate, and
the whole evaluation against a stand-in of vLLM's OpenAI API (/v1/models, runtime LoRA loading) with a stand-in
scorer; `make e2e`'s `adapters` scenario runs it with lm-eval against vLLM's CPU build."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from conftest import PROJECT_DIR, load_file

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "evaluate.py"


@pytest.fixture(scope="module")
def ev() -> ModuleType:
    return load_file(SCRIPT, "evaluate_script")


TASK_SCRIPT = SCRIPT.parent / "evaluate_task.py"


@pytest.fixture(scope="module")
def et() -> ModuleType:
    return load_file(TASK_SCRIPT, "evaluate_task_script")


class ChatTokenizer:
    """A stand-in tokenizer: one id per character, BOS 1 as a special token, and a ChatML-like template."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_a_task_file_is_checked_record_by_record(et: ModuleType) -> None:
    lines = ['{"prompt": "Is one next to two?", "reference": "no", "id": 1}', "", "not json",
             '{"prompt": "", "reference": "no"}', '["a list"]', '{"prompt": "p"}',
             '{"messages": [{"role": "user", "content": "hi"}]}',  # no assistant turn: nothing to score
             '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, '
             '{"role": "user", "content": "c"}]}',  # the last turn is the user's
             '{"text": "a document"}', '{"question": "q", "answer": "a"}']
    records, problems = et.read_records(lines)
    assert problems == [
        "line 3: not JSON (Expecting value)", "line 4: 'prompt' and 'reference' must be non-empty strings",
        "line 5: a JSON object expected (messages, or prompt and reference)",
        "line 6 has the fields prompt: none of a known format (messages, conversations, instruction + output, "
        "prompt + completion, prompt + reference)",
        "line 7: the last turn of 'messages' is not the assistant's: the reference is the conversation's last "
        "assistant turn",
        "line 8: the last turn of 'messages' is not the assistant's: the reference is the conversation's last "
        "assistant turn",
        "line 9: a text record has no reference to score; give messages (the last assistant turn is the "
        "reference), prompt + completion or prompt + reference",
        "line 10 has the fields answer, question: none of a known format (messages, conversations, instruction + "
        "output, prompt + completion, prompt + reference)"]
    assert [r.reference for r in records] == ["no"]
    assert et.read_records(["", " "]) == ([], ["no records"])


def test_every_format_training_takes_is_a_task(et: ModuleType) -> None:
    lines = ['{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, '
             '{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}, '
             '{"role": "assistant", "content": "a2"}]}',
             '{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}',
             '{"prompt": "p", "completion": "c"}', '{"instruction": "i", "input": "", "output": "o"}']
    records, problems = et.read_records(lines)
    assert problems == []
    first = records[0]
    # The reference is the last assistant turn; every turn before it (the first answer included) is the prompt.
    assert first.reference == "a2" and [m["content"] for m in first.messages] == ["s", "q", "a1", "q2"]
    assert first.prompt is None and et.raw_problems(records)[0].startswith("record 1: a conversation, but the "
                                                                          "export was trained raw")
    assert [(r.reference, r.prompt is not None) for r in records[1:]] == [("a", False), ("c", True), ("o", True)]


def test_chat_records_are_rendered_as_the_chat_endpoint_renders_them(et: ModuleType) -> None:
    records, _ = et.read_records(['{"messages": [{"role": "user", "content": "q"}, '
                                  '{"role": "assistant", "content": "yes"}]}', '{"prompt": "p", "reference": "r"}'])
    chat = et.rendered(records, "chat", ChatTokenizer())
    # The context is the template with the generation prompt (no BOS added: the chat endpoint adds no special
    # tokens); the continuation is the answer as the template renders it, without the end of the turn after it.
    assert chat[0] == {"context": "<user>q</><assistant>", "continuation": "yes", "reference": "yes",
                       "tokens": len("yes")}
    assert et.answer_text(" yes</>\n", "yes ") == " yes"  # a template that trims the answer: up to its end
    assert et.answer_text("YES</>", "yes") == "YES</>"  # not found as written: the whole turn
    raw = et.rendered(records[1:], "raw", ChatTokenizer())
    assert raw == [{"context": "p", "continuation": "r", "reference": "r", "tokens": 1}]


def test_the_local_tasks_need_no_hub(et: ModuleType, tmp_path: Path) -> None:
    docs = [{"context": "c", "continuation": "x", "reference": "x", "tokens": 1}]
    et.write_tasks(tmp_path, docs, "chat", 8)
    task = yaml.safe_load((tmp_path / "deepspeed_stack_heldout.yaml").read_text())
    # datasets' json loader on the local file (no hub id), greedy generation (a chat reply until its turn ends,
    # no newline stop), exact match of the stripped reply: what lm-eval reports as "exact_match,strip".
    assert (task["dataset_path"], task["dataset_kwargs"], task["test_split"]) == (
        "json", {"data_files": {"test": str(tmp_path / "task.jsonl")}}, "test")
    assert task["output_type"] == "generate_until"
    # Zero-shot in the file itself: evaluate.py calls lm-eval's evaluate(), not simple_evaluate, which set it.
    assert task["num_fewshot"] == 0
    assert task["generation_kwargs"] == {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": 8}
    assert (task["doc_to_text"], task["doc_to_target"]) == ("context", "reference")
    assert [f["function"] for f in task["filter_list"][0]["filter"]] == ["remove_whitespace", "take_first"]
    assert task["filter_list"][0]["name"] == "strip" and task["metric_list"][0]["metric"] == "exact_match"
    et.write_tasks(tmp_path, docs, "raw", 8)
    assert yaml.safe_load((tmp_path / "deepspeed_stack_heldout.yaml").read_text())["generation_kwargs"][
        "until"] == ["\n"]
    # The likelihood task: its !function tags name functions of the module copied beside it (lm-eval imports
    # MODULE.py from the task file's folder; make e2e runs it with lm-eval itself).
    metrics = load_file(tmp_path / "evaluate_metrics.py", "evaluate_metrics_copy")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: getattr(
        metrics, loader.construct_scalar(node).removeprefix("evaluate_metrics.")))
    ll = yaml.load((tmp_path / "deepspeed_stack_heldout_ll.yaml").read_text(), Loader=Loader)
    assert (ll["output_type"], ll["doc_to_text"], ll["doc_to_target"], ll["target_delimiter"]) == (
        "loglikelihood", "context", "continuation", "")
    assert ll["num_fewshot"] == 0
    assert ll["process_results"]({"tokens": 4}, [(-2.0, False)]) == {"loglikelihood": (-2.0, 4)}
    aggregate = ll["metric_list"][0]["aggregation"]
    assert aggregate([(-2.0, 4), (-1.0, 1)]) == pytest.approx(-0.6)  # per token over all records: -3 / 5


@pytest.mark.parametrize(("scores", "gate", "serve", "reference", "improvement"), [
    ({"base": 0.2, "served": None, "candidate": 0.3}, None, True, "base", 0.1),    # no gate: served
    ({"base": 0.2, "served": None, "candidate": 0.3}, 0.1, True, "base", 0.1),     # beats the base by the margin
    ({"base": 0.2, "served": None, "candidate": 0.25}, 0.1, False, "base", 0.05),  # not by enough
    ({"base": 0.2, "served": 0.6, "candidate": 0.5}, 0.0, False, "served", -0.1),  # worse than the adapter served now
    ({"base": 0.2, "served": 0.6, "candidate": 0.7}, 1.0, False, "served", 0.1),   # an impossible gate
])
def test_the_gate(ev: ModuleType, scores: dict[str, Any], gate: float | None, serve: bool, reference: str,
                  improvement: float) -> None:
    decision = ev.decide(scores, gate)
    assert (decision.serve, decision.reference) == (serve, reference)
    assert decision.improvement == pytest.approx(improvement)


def test_the_likelihood_gate_reads_nats_per_token(ev: ModuleType) -> None:
    """Log-likelihoods are negative; closer to 0 is better, and the improvement is the difference."""
    served = ev.decide({"base": -2.0, "served": None, "candidate": -1.5}, 0.3, "loglikelihood")
    assert (served.serve, served.improvement) == (True, 0.5)
    kept = ev.decide({"base": -2.0, "served": -1.0, "candidate": -1.2}, 0.0, "loglikelihood")
    assert (kept.serve, kept.reference, kept.improvement) == (False, "served", pytest.approx(-0.2))
    assert ev.passes(0.0, 0.0) and ev.passes(-5.0, None) and not ev.passes(0.04, 0.05)


def test_the_reason_says_what_stays(ev: ModuleType) -> None:
    kept = ev.decide({"base": 0.2, "served": 0.6, "candidate": 0.5}, 0.05)
    assert kept.reason == ("0.500 against the adapter served now's 0.600 is -0.100, less than minImprovement 0.05: "
                           "not served; the adapter served now stays")


def test_the_copy_is_whole_before_it_is_there(ev: ModuleType, tmp_path: Path) -> None:
    candidate = tmp_path / "models" / "b"
    candidate.mkdir(parents=True)
    for name, text in (("adapter_model.safetensors", "w"), ("adapter_config.json", "{}"), (".complete", "{}")):
        (candidate / name).write_text(text)
    target = tmp_path / "evals" / "b" / "adapter"
    target.mkdir(parents=True)
    (target / "stale.bin").write_text("old")
    ev.copy_adapter(candidate, target)
    assert sorted(p.name for p in target.iterdir()) == [".complete", "adapter_config.json",
                                                        "adapter_model.safetensors"]
    assert not target.with_name("adapter.new").exists()


class FakeVllm:
    """/v1/models and vLLM's runtime LoRA routes, recording what was asked."""

    def __init__(self, models: list[str]) -> None:
        self.models = list(models)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply({"data": [{"id": m} for m in fake.models]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.calls.append((self.path, body))
                if self.path == "/v1/load_lora_adapter" and body["lora_name"] not in fake.models:
                    fake.models.append(body["lora_name"])
                if self.path == "/v1/unload_lora_adapter":
                    fake.models.remove(body["lora_name"])
                self._reply({})

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits for serve_forever to look again (0.5 s by default, at every teardown).
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(["base", "a", "b"])
    yield fake
    fake.server.shutdown()


CHAT_MARKER = {"export": "adapter", "step": 10, "finished": "2026-11-29T06:00:00+00:00", "rendering": "chat"}


def _inputs(tmp_path: Path, marker: dict[str, Any] | None = None, weights: str = "new") -> tuple[Path, Path]:
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": "no"}]}) + "\n"
                            for i in range(20)))
    candidate = tmp_path / "models" / "b"
    candidate.mkdir(parents=True, exist_ok=True)
    (candidate / "adapter_model.safetensors").write_text(weights)
    (candidate / ".complete").write_text(json.dumps(marker or CHAT_MARKER))
    return task, candidate


def _run(ev: ModuleType, vllm: FakeVllm, tmp_path: Path, scores: dict[str, float], *extra: str,
         marker: dict[str, Any] | None = None, weights: str = "new") -> dict[str, Any]:
    task, candidate = _inputs(tmp_path, marker, weights)
    args = ev.parse_args(["--url", vllm.url, "--base", "base", "--adapter", "b", "--candidate", str(candidate),
                          "--task", str(task), "--results", str(tmp_path / "evals" / "b" / "results.json"), *extra])
    asked = []

    def scorer(url: str, model: str, how: Any) -> dict[str, float]:
        asked.append(model)
        assert (how.task_dir / "deepspeed_stack_heldout.yaml").is_file()
        assert (how.task_dir / "deepspeed_stack_heldout_ll.yaml").is_file()
        docs = [json.loads(line) for line in (how.task_dir / "task.jsonl").read_text().splitlines()]
        assert len(docs) == 20 and docs[0]["context"] == "<user>q0</><assistant>"  # the chat rendering
        # The export's own tokenizer: its versioned copy.
        assert Path(how.tokenizer).parent == tmp_path / "evals" / "b" / "versions"
        return {"loglikelihood": scores[model], "exact_match": 0.0}

    tools = ev.Tools(scorer=scorer, version=lambda: "0.4.13", tokenizer=lambda _folder: ChatTokenizer())
    out = ev.evaluate(args, tools)
    assert asked[0] == "base" and asked[-1] == "b-candidate"  # the same task for all, the adapter served now too
    return out


def test_a_candidate_that_beats_the_adapter_served_now_replaces_it(ev: ModuleType, vllm: FakeVllm,
                                                                   tmp_path: Path) -> None:
    versions = tmp_path / "evals" / "b" / "versions"
    (versions / "b-5-20261128T000000").mkdir(parents=True)  # an older export's copy, served until now
    out = _run(ev, vllm, tmp_path, {"base": -3.0, "b": -2.0, "b-candidate": -1.0}, "--min-improvement", "0.1")
    copy = str(versions / "b-10-20261129T060000")  # NAME-STEP-TIME: its own path, never another export's
    assert vllm.calls == [
        ("/v1/load_lora_adapter", {"lora_name": "b-candidate", "lora_path": copy, "load_inplace": False}),
        ("/v1/unload_lora_adapter", {"lora_name": "b-candidate"}),
        ("/v1/load_lora_adapter", {"lora_name": "b", "lora_path": copy, "load_inplace": True})]
    assert (out["served"], out["reference"], out["servedPath"]) == (True, "served", copy)
    assert (out["metric"], out["rendering"], out["records"]) == ("loglikelihood", "chat", 20)
    assert out["scores"] == {"base": -3.0, "served": -2.0, "candidate": -1.0}
    assert out["byMetric"]["exact_match"] == {"base": 0.0, "served": 0.0, "candidate": 0.0}
    assert out["candidateMarker"] == CHAT_MARKER
    assert (Path(copy) / "adapter_model.safetensors").read_text() == "new"
    assert json.loads((tmp_path / "evals" / "b" / "served.json").read_text())["path"] == copy
    assert [p.name for p in versions.iterdir()] == ["b-10-20261129T060000"]  # the old copy removed after the switch


def test_an_impossible_gate_keeps_the_old_model(ev: ModuleType, vllm: FakeVllm, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(ev, vllm, tmp_path, {"base": -3.0, "b": -2.0, "b-candidate": -1.1}, "--min-improvement", "1")
    assert [path for path, _ in vllm.calls] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    assert vllm.models == ["base", "a", "b"]
    assert (out["served"], out["servedPath"], out["minImprovement"]) == (False, None, 1.0)
    assert not (tmp_path / "evals" / "b" / "versions" / "b-10-20261129T060000").exists()  # its copy removed
    assert not (tmp_path / "evals" / "b" / "served.json").exists()
    written = json.loads((tmp_path / "evals" / "b" / "results.json").read_text())
    assert written == out
    assert ("[evaluate] b: base -3.000 vs tuned -1.100, served now -2.000 (loglikelihood); -1.100 against the "
            "adapter served now's -2.000 is +0.900, less than minImprovement 1: not served; the adapter served now "
            "stays; chat rendering, 20 records") in capsys.readouterr().out


def test_a_second_export_gets_its_own_path_and_scores(ev: ModuleType, vllm: FakeVllm, tmp_path: Path) -> None:
    first = _run(ev, vllm, tmp_path, {"base": -3.0, "b": -2.0, "b-candidate": -1.0})
    vllm.calls.clear()
    second = _run(ev, vllm, tmp_path, {"base": -3.0, "b": -1.0, "b-candidate": -2.5}, "--min-improvement", "0",
                  marker={**CHAT_MARKER, "step": 20, "finished": "2026-11-29T07:00:00+00:00"}, weights="wrong")
    assert first["candidateCopy"] != second["candidateCopy"]
    assert second["scores"] == {"base": -3.0, "served": -1.0, "candidate": -2.5} and second["served"] is False
    assert vllm.calls[0][1]["lora_path"].endswith("b-20-20261129T070000")
    served = json.loads((tmp_path / "evals" / "b" / "served.json").read_text())
    assert served["path"] == first["servedPath"] and served["marker"]["step"] == 10  # the first stays served


def test_a_raw_export_is_scored_raw_by_exact_match(ev: ModuleType, vllm: FakeVllm, tmp_path: Path) -> None:
    task, candidate = _inputs(tmp_path, {"export": "adapter", "step": 3, "rendering": "raw"})
    args = ev.parse_args(["--url", vllm.url, "--base", "base", "--adapter", "b", "--candidate", str(candidate),
                          "--task", str(task), "--results", str(tmp_path / "r" / "results.json")])
    tools = ev.Tools(scorer=lambda *_: {}, tokenizer=lambda _f: ChatTokenizer())
    with pytest.raises(ev.UsageError, match="record 1: a conversation, but the export was trained raw"):
        ev.evaluate(args, tools)
    task.write_text('{"prompt": "p", "reference": "r"}\n')
    tools = ev.Tools(scorer=lambda *_: {"loglikelihood": -1.0, "exact_match": 0.5}, version=lambda: "x",
                     tokenizer=lambda _f: ChatTokenizer())
    out = ev.evaluate(args, tools)
    assert (out["metric"], out["rendering"], out["scores"]["candidate"]) == ("exact_match", "raw", 0.5)


def test_a_bad_task_or_a_merged_model_exits_2(ev: ModuleType, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    task, candidate = _inputs(tmp_path)
    base = ["--url", "http://127.0.0.1:9", "--base", "base", "--adapter", "b", "--candidate", str(candidate),
            "--results", str(tmp_path / "r.json")]
    task.write_text('{"prompt": "q"}\n')
    assert ev.main([*base, "--task", str(task)]) == ev.EXIT_USAGE
    assert "line 1 has the fields prompt: none of a known format" in capsys.readouterr().out
    (tmp_path / "x").mkdir()
    good_task, _ = _inputs(tmp_path / "x")
    (candidate / ".complete").write_text(json.dumps({"export": "merged"}))
    assert ev.main([*base, "--task", str(good_task)]) == ev.EXIT_USAGE
    assert "its marker says export 'merged', not an adapter" in capsys.readouterr().out
    assert ev.main([*base, "--task", str(task), "--min-improvement", "2"]) == ev.EXIT_USAGE


def _schema_key(node: Any, key: str) -> dict[str, Any] | None:
    """The first property named `key` anywhere in the schema."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict) and key in node["properties"]:
            return node["properties"][key]
        for value in node.values():
            if (found := _schema_key(value, key)) is not None:
                return found
    if isinstance(node, list):
        for value in node:
            if (found := _schema_key(value, key)) is not None:
                return found
    return None


def test_the_gates_bounds_are_the_schemas(ev: ModuleType, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # serving.evaluation.minImprovement takes 0..1; evaluate.py took -1..1 (issue 41 item 4): one range, two sides.
    prop = _schema_key(yaml.safe_load((PROJECT_DIR / "model" / "schema.yaml").read_text(encoding="utf-8")),
                       "minImprovement")
    assert prop is not None and (prop["minimum"], prop["maximum"]) == ev.MIN_IMPROVEMENT_RANGE == (0, 1)
    task, candidate = _inputs(tmp_path)
    base = ["--url", "http://127.0.0.1:9", "--base", "base", "--adapter", "b", "--candidate", str(candidate),
            "--results", str(tmp_path / "r.json"), "--task", str(task)]
    assert ev.main([*base, "--min-improvement", "-0.5"]) == ev.EXIT_USAGE  # served worse than now: refused
    assert "--min-improvement must be between 0 and 1, got -0.5" in capsys.readouterr().out
