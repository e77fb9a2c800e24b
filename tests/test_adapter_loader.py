"""recipes/adapter_loader.py (issue 42 item 1): each replica serves the adapter versions the one evaluator
decided (EVALS/NAME/served.json), loads them at start, switches when the decision changes, and is Ready only once
it serves every decided version. Driven with an in-process stand-in of vLLM's adapter endpoints (no network, no
sleeping); the folders are the evaluator's own layout (evaluate_copies.py writes them here)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import load_file

SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"


@pytest.fixture(scope="module")
def loader() -> ModuleType:
    return load_file(SCRIPTS / "adapter_loader.py", "adapter_loader_script")


@pytest.fixture(scope="module")
def copies() -> ModuleType:
    return load_file(SCRIPTS / "evaluate_copies.py", "evaluate_copies_for_loader")


class FakeVllm:
    """vLLM's runtime adapters as its API shows them: name -> path; a load in place replaces, a second plain load of
    a served name is refused (vllm/entrypoints/openai/models/serving.py: "already loaded ... load_inplace")."""

    def __init__(self, served: dict[str, str] | None = None, fail: set[str] | None = None) -> None:
        self.adapters = dict(served or {})
        self.calls: list[tuple[str, str, bool]] = []
        self.fail = fail or set()

    def load(self, name: str, path: str, inplace: bool) -> None:
        self.calls.append((name, path, inplace))
        if path in self.fail:
            raise ValueError("400 Bad Request: no adapter at that path")
        if name in self.adapters and not inplace:
            raise ValueError(f"The lora adapter '{name}' has already been loaded")
        self.adapters[name] = path


def server(loader: ModuleType, fake: FakeVllm) -> Any:
    return loader.Server(served=lambda: dict(fake.adapters), load=fake.load)


def promote(copies: ModuleType, evals: Path, name: str, step: int, whole: bool = True) -> str:
    """What the evaluator leaves when an export passes: its versioned copy (marker last) and served.json."""
    folder = evals / name
    copy = folder / "versions" / f"{name}-{step}-20261129T0{step}0000"
    copy.mkdir(parents=True)
    (copy / "adapter_model.safetensors").write_bytes(b"w")
    marker = {"export": "adapter", "step": step}
    if whole:
        (copy / ".complete").write_text('{"export": "adapter"}', encoding="utf-8")
    copies.write_served(folder / "served.json", name, copy, marker)
    return str(copy)


def test_a_new_replica_loads_the_decided_version_before_it_is_ready(loader: ModuleType, copies: ModuleType,
                                                                    tmp_path: Path) -> None:
    v2 = promote(copies, tmp_path, "chat", 200)
    fake = FakeVllm()
    ready = tmp_path / "ready"
    loader.mark(ready, loader.Result(waiting={"chat": "not yet"}))
    assert not ready.exists()
    result = loader.sync(tmp_path, ["chat"], server(loader, fake))
    loader.mark(ready, result)
    assert fake.calls == [("chat", v2, False)]
    assert result.loaded == ["chat"] and result.ready and ready.exists()


def test_a_promotion_switches_every_replica_in_place(loader: ModuleType, copies: ModuleType, tmp_path: Path) -> None:
    """Two replicas on one decision; the evaluator promotes step 300: both replace step 200 under the same name."""
    v2 = promote(copies, tmp_path, "chat", 200)
    replicas = [FakeVllm({"chat": v2}), FakeVllm()]
    for fake in replicas:
        loader.sync(tmp_path, ["chat"], server(loader, fake))
    assert [f.adapters for f in replicas] == [{"chat": v2}, {"chat": v2}]
    v3 = promote(copies, tmp_path, "chat", 300)
    for fake in replicas:
        assert loader.sync(tmp_path, ["chat"], server(loader, fake)).ready
    assert [f.adapters for f in replicas] == [{"chat": v3}, {"chat": v3}]
    assert replicas[0].calls == [("chat", v3, True)]  # in place: NAME never stops answering
    assert replicas[1].calls[-1] == ("chat", v3, True)


def test_nothing_decided_serves_the_base_and_is_ready(loader: ModuleType, tmp_path: Path) -> None:
    fake = FakeVllm()
    result = loader.sync(tmp_path, ["chat", "support"], server(loader, fake))
    assert result.ready and fake.calls == []


def test_a_copy_not_yet_whole_is_waited_for(loader: ModuleType, copies: ModuleType, tmp_path: Path) -> None:
    """served.json may show through the mount before the copy's marker: a replica that serves nothing of NAME waits
    (not Ready); one that serves the older version keeps serving it and stays Ready."""
    v2 = promote(copies, tmp_path, "chat", 200)
    promote(copies, tmp_path, "chat", 300, whole=False)
    new, old = FakeVllm(), FakeVllm({"chat": v2})
    assert loader.sync(tmp_path, ["chat"], server(loader, new)).waiting == {
        "chat": "its decided copy is not whole yet"}
    assert loader.sync(tmp_path, ["chat"], server(loader, old)).ready
    assert new.calls == [] and old.calls == []


def test_a_failed_load_keeps_the_replica_out_and_the_others_go_on(loader: ModuleType, copies: ModuleType,
                                                                 tmp_path: Path) -> None:
    chat = promote(copies, tmp_path, "chat", 200)
    support = promote(copies, tmp_path, "support", 100)
    fake = FakeVllm(fail={chat})
    result = loader.sync(tmp_path, ["chat", "support"], server(loader, fake))
    assert result.loaded == ["support"] and fake.adapters == {"support": support}
    assert not result.ready and result.waiting["chat"].startswith(f"loading {chat}: 400 Bad Request")


def test_a_restarted_server_is_loaded_again(loader: ModuleType, copies: ModuleType, tmp_path: Path) -> None:
    """vLLM forgets runtime-loaded adapters when it restarts: the next pass loads the decision again (not in place)."""
    v2 = promote(copies, tmp_path, "chat", 200)
    fake = FakeVllm({"chat": v2})
    assert loader.sync(tmp_path, ["chat"], server(loader, fake)).loaded == []
    fake.adapters.clear()
    assert loader.sync(tmp_path, ["chat"], server(loader, fake)).loaded == ["chat"]
    assert fake.calls == [("chat", v2, False)]


def test_only_adapters_are_read_from_the_model_list(loader: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's /v1/models: the base has no parent; each adapter its base as parent and its path as root."""
    listing = ('{"data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "root": "Qwen/Qwen2.5-7B-Instruct", "parent": null}, '
               '{"id": "chat", "root": "/evals/chat/versions/chat-200-x", "parent": "Qwen/Qwen2.5-7B-Instruct"}]}')
    monkeypatch.setattr(loader, "_request", lambda url, body=None, timeout=0: listing)
    assert loader.served_adapters("http://127.0.0.1:8000") == {"chat": "/evals/chat/versions/chat-200-x"}
