"""recipes/client_endpoints.py (issue 36 item 8): with serving.evaluation, vLLM's runtime LoRA endpoints
answer the pod's own evaluator (loopback) and no client: a client's load or unload gets 403, its prompts go
through. make e2e's `adapters` scenario runs the same middleware inside vLLM's CPU server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "client_endpoints.py"


@pytest.fixture(scope="module")
def ce() -> ModuleType:
    return load_file(SCRIPT, "client_endpoints_script")


def _call(ce: ModuleType, path: str, client: tuple[str, int] | None, kind: str = "http") -> tuple[list[Any], bool]:
    """The middleware around a stand-in app: what it sent, and whether the app was reached."""
    reached = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    scope = {"type": kind, "path": path, "method": "POST", "client": client}
    # A loop of its own, never made the thread's current one: asyncio.run would leave the thread without one, and
    # the Pulumi mocks of later tests in this process ask for it.
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(ce.ClientEndpoints(app)(scope, receive, send))
    finally:
        loop.close()
    return sent, bool(reached)


@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters",
                                  "/reset_prefix_cache", "/v1/load_lora_adapter/", "/V1/completions"])
def test_a_client_cannot_manage_adapters(ce: ModuleType, path: str) -> None:
    sent, reached = _call(ce, path, ("10.8.0.12", 51234))
    assert not reached
    assert sent[0]["status"] == 403
    assert json.loads(sent[1]["body"])["error"]["code"] == 403


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/tune",
                                  "/health", "/metrics"])
def test_a_client_is_served(ce: ModuleType, path: str) -> None:
    assert _call(ce, path, ("10.8.0.12", 51234)) == ([], True)


@pytest.mark.parametrize("client", [("127.0.0.1", 40000), ("::1", 40000), ("127.0.0.2", 1)])
def test_the_pods_own_evaluator_may(ce: ModuleType, client: tuple[str, int]) -> None:
    assert _call(ce, "/v1/load_lora_adapter", client) == ([], True)


def test_no_peer_or_a_name_is_not_the_pod(ce: ModuleType) -> None:
    assert _call(ce, "/v1/unload_lora_adapter", None)[1] is False
    assert _call(ce, "/v1/unload_lora_adapter", ("localhost", 1))[1] is False  # an address only, never a name
    sent, reached = _call(ce, "/v1/unload_lora_adapter", ("10.0.0.1", 1), kind="websocket")
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    assert _call(ce, "/anything", ("10.0.0.1", 1), kind="lifespan")[1] is True  # startup and shutdown go through
