"""`serving.adapters` also takes adapter folders of the bucket, trained anywhere (issue 42 item 4): rendered beside
the stack's own adapters (vLLM's --lora-modules NAME=PATH through the server's GCS FUSE mount, no marker to wait
for, their memory sized), checked at preview for what they record (a rank vLLM's --max-lora-rank takes, the base this
server serves), and a failing input for each rule."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import changed, config_model, problems

from checks import warnings
from preview import engine
from preview.engine import RunResult
from workloads.kinds.serve_engine import serve_request
from workloads.serving_source import model_source

W = "workloads.chat"
BASE = "Qwen/Qwen2.5-7B-Instruct"  # what the example's tune trains on (finetune.model), so the server's base
EXT = {"name": "support-v2", "path": "adapters/support-v2", "rank": 32, "base": BASE}
KEY = f"{W}.serving.adapters[0]"


def folders(*items: dict[str, Any], **more: Any) -> dict[str, Any]:
    """serving.adapters with these items (a key set to None left out), and more keys."""
    return {f"{W}.serving.adapters": [{k: v for k, v in i.items() if v is not None} for i in items], **more}


@pytest.fixture(scope="module")
def served() -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("finetune", folders(EXT))), stack="finetune")


def test_a_folder_is_served_beside_the_stacks_own(served: RunResult) -> None:
    assert problems("finetune", folders(EXT)) == []
    server = served.one("kubernetes:apps/v1:Deployment", "chat-deployment").inputs["spec"]["template"]["spec"]
    args = server["containers"][0]["args"]
    modules = args[args.index("--lora-modules") + 1:]
    assert modules == ["tune=/gcs/models/tune", "support-v2=/gcs/adapters/support-v2"]
    # The rank holds both (tune's 16, the folder's 32): vLLM's 32; a batch mixes both.
    assert args[args.index("--max-lora-rank") + 1] == "32" and args[args.index("--max-loras") + 1] == "2"
    # Only training's export is waited for: nothing of the stack writes a marker into the folder.
    (wait,) = server["initContainers"]
    assert [e["value"] for e in wait["env"]] == ["/gcs/models/tune/.complete"]
    assert served.outputs["workloads"]["chat"]["adapters"] == {"tune": "/gcs/models/tune",
                                                               "support-v2": "/gcs/adapters/support-v2"}


def test_its_memory_is_sized_with_the_model() -> None:
    m = config_model(changed("finetune", folders(EXT)))
    request = serve_request(m, m.workloads["chat"])
    assert request is not None and (request.adapter_slots, request.adapter_rank) == (2, 32)
    source = model_source(m, m.workloads["chat"])
    assert [(a.name, a.rank, a.trained_here) for a in source.adapters] == [("tune", 16, True),
                                                                            ("support-v2", 32, False)]


@pytest.mark.parametrize(("change", "expected"), [
    (folders({**EXT, "rank": None}), f"{KEY}.rank: unset, and {W}.serving.maxLoraRank is unset"),
    (folders({**EXT, "rank": 1024}), f"{KEY}.rank: 1024, but vLLM serves adapters of rank 512 at most"),
    (folders(EXT, **{f"{W}.serving.maxLoraRank": 16}),
     f"{W}.serving.maxLoraRank: 16, but support-v2 is an adapter of rank 32 ({KEY}.rank)"),
    (folders({**EXT, "base": "meta-llama/Llama-3.1-8B-Instruct"}),
     f"{KEY}.base: support-v2 was trained on meta-llama/Llama-3.1-8B-Instruct, but this server's base is " + BASE),
    (folders({**EXT, "name": "tune"}), f"{KEY}.name: tune is already a name this stack serves or a workload's"),
    (folders(EXT, **{f"{W}.serving.engine": "mii"}), f"{W}.serving.engine: mii serves no LoRA adapters"),
    (folders(EXT, **{f"{W}.serving.evaluation": {"task": "data/heldout.jsonl"}}),
     f"{KEY}: a folder adapter with {W}.serving.evaluation"),
    (folders({"name": "x", "path": "gs://bucket/adapters/x", "rank": 8}),
     f'{KEY}.path: "gs://bucket/adapters/x" is a gs:// URL'),
    (folders({"name": "x", "rank": 8}), f"{KEY}.path: required key is missing"),
])
def test_refused(change: dict[str, Any], expected: str) -> None:
    found = problems("finetune", change)
    assert any(p.startswith(expected) for p in found), found


def test_a_whole_model_server_refuses_a_folders_base() -> None:
    merged = folders(EXT, **{"workloads.tune.finetune.lora.export": "merged"})
    assert any(p.startswith(f"{KEY}.base: {BASE}, but serving.fromWorkload tune serves a whole model")
               for p in problems("finetune", merged))


def test_an_unrecorded_base_warns() -> None:
    found = warnings(config_model(changed("finetune", folders({**EXT, "base": None}))))
    assert any(w.startswith(f"{KEY}.base: unset, so support-v2 is not checked against this server's base ({BASE})")
               for w in found), found
    assert not any("is not checked against" in w for w in warnings(config_model(changed("finetune", folders(EXT)))))
