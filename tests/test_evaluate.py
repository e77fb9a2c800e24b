"""workloads/scripts/evaluate.py (issue 27 item 4): the held-out task's checks, lm-eval's local task, the gate, and
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
from conftest import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "workloads" / "scripts" / "evaluate.py"


@pytest.fixture(scope="module")
def ev() -> ModuleType:
    return load_file(SCRIPT, "evaluate_script")


def test_a_task_file_is_checked_record_by_record(ev: ModuleType) -> None:
    lines = ['{"prompt": "Is one next to two?", "reference": "no", "id": 1}', "", "not json",
             '{"prompt": "", "reference": "no"}', '["a list"]', '{"prompt": "p"}']
    assert ev.task_problems(lines) == [
        "line 3: not JSON (Expecting value)", "line 4: 'prompt' must be a non-empty string",
        "line 5: a JSON object with 'prompt' and 'reference' expected",
        "line 6: 'reference' must be a non-empty string"]
    assert ev.task_problems(lines[:2]) == []
    assert ev.task_problems(["", " "]) == ["no records"]


def test_the_local_task_needs_no_hub(ev: ModuleType, tmp_path: Path) -> None:
    task = yaml.safe_load(ev.task_yaml(tmp_path / "task.jsonl", 8))
    # datasets' json loader on the local file (no hub id), greedy generation until a newline, exact match on the
    # text with leading whitespace removed: what lm-eval reports as "exact_match,strip".
    assert (task["dataset_path"], task["dataset_kwargs"], task["test_split"]) == (
        "json", {"data_files": {"test": str(tmp_path / "task.jsonl")}}, "test")
    assert task["output_type"] == "generate_until"
    assert task["generation_kwargs"] == {"until": ["\n"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 8}
    assert (task["doc_to_text"], task["doc_to_target"]) == ("{{prompt}}", "{{reference}}")
    assert [f["function"] for f in task["filter_list"][0]["filter"]] == ["remove_whitespace", "take_first"]
    assert task["filter_list"][0]["name"] == "strip" and task["metric_list"][0]["metric"] == "exact_match"


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


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"q{i}", "reference": "no"}) + "\n" for i in range(20)))
    candidate = tmp_path / "models" / "b"
    candidate.mkdir(parents=True)
    (candidate / "adapter_model.safetensors").write_text("new")
    (candidate / ".complete").write_text(json.dumps({"export": "adapter", "step": 10}))
    return task, candidate


def _run(ev: ModuleType, vllm: FakeVllm, tmp_path: Path, scores: dict[str, float], *extra: str) -> dict[str, Any]:
    task, candidate = _inputs(tmp_path)
    args = ev.parse_args(["--url", vllm.url, "--base", "base", "--adapter", "b", "--candidate", str(candidate),
                          "--task", str(task), "--results", str(tmp_path / "evals" / "b" / "results.json"), *extra])
    asked = []

    def scorer(url: str, model: str, task_dir: Path) -> float:
        asked.append(model)
        assert (task_dir / "deepspeed_stack_heldout.yaml").is_file()
        assert len((task_dir / "task.jsonl").read_text().splitlines()) == 20
        return scores[model]

    out = ev.evaluate(args, scorer=scorer, version=lambda: "0.4.13")
    assert asked == ["base", "b", "b-candidate"]  # the same task for all three, the adapter served now included
    return out


def test_a_candidate_that_beats_the_adapter_served_now_replaces_it(ev: ModuleType, vllm: FakeVllm,
                                                                   tmp_path: Path) -> None:
    out = _run(ev, vllm, tmp_path, {"base": 0.1, "b": 0.4, "b-candidate": 0.6}, "--min-improvement", "0.1")
    copy = str(tmp_path / "evals" / "b" / "adapter")
    assert vllm.calls == [
        ("/v1/load_lora_adapter", {"lora_name": "b-candidate", "lora_path": str(tmp_path / "models" / "b"),
                                   "load_inplace": False}),
        ("/v1/unload_lora_adapter", {"lora_name": "b-candidate"}),
        # Served from the copy beside results.json, in place of the old one.
        ("/v1/load_lora_adapter", {"lora_name": "b", "lora_path": copy, "load_inplace": True})]
    assert (out["served"], out["reference"], out["servedPath"]) == (True, "served", copy)
    assert out["scores"] == {"base": 0.1, "served": 0.4, "candidate": 0.6}
    assert out["candidateMarker"] == {"export": "adapter", "step": 10} and out["records"] == 20
    assert (Path(copy) / "adapter_model.safetensors").read_text() == "new"


def test_an_impossible_gate_keeps_the_old_model(ev: ModuleType, vllm: FakeVllm, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(ev, vllm, tmp_path, {"base": 0.1, "b": 0.4, "b-candidate": 0.6}, "--min-improvement", "1")
    assert [path for path, _ in vllm.calls] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    assert vllm.models == ["base", "a", "b"]
    assert (out["served"], out["servedPath"], out["minImprovement"]) == (False, None, 1.0)
    assert not (tmp_path / "evals" / "b" / "adapter").exists()
    written = json.loads((tmp_path / "evals" / "b" / "results.json").read_text())
    assert written == out
    assert ("[evaluate] b: base 0.100 vs tuned 0.600, served now 0.400 (exact_match); 0.600 against the adapter "
            "served now's 0.400 is +0.200, less than minImprovement 1: not served; the adapter served now stays"
            ) in capsys.readouterr().out


def test_a_bad_task_or_a_merged_model_exits_2(ev: ModuleType, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    task, candidate = _inputs(tmp_path)
    base = ["--url", "http://127.0.0.1:9", "--base", "base", "--adapter", "b", "--candidate", str(candidate),
            "--results", str(tmp_path / "r.json")]
    task.write_text('{"prompt": "q"}\n')
    assert ev.main([*base, "--task", str(task)]) == ev.EXIT_USAGE
    assert "line 1: 'reference' must be a non-empty string" in capsys.readouterr().out
    (tmp_path / "x").mkdir()
    good_task, _ = _inputs(tmp_path / "x")
    (candidate / ".complete").write_text(json.dumps({"export": "merged"}))
    assert ev.main([*base, "--task", str(good_task)]) == ev.EXIT_USAGE
    assert "its marker says export 'merged', not an adapter" in capsys.readouterr().out
    assert ev.main([*base, "--task", str(task), "--min-improvement", "2"]) == ev.EXIT_USAGE
