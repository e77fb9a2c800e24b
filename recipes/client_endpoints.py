"""vLLM's API answers clients on its serving endpoints only: an ASGI middleware (vLLM's `--middleware
client_endpoints.ClientEndpoints`, this file on PYTHONPATH) that refuses, with 403, every other path to any peer
that is not this pod itself.

Why: with `serving.evaluation` vLLM runs with VLLM_ALLOW_RUNTIME_LORA_UPDATING, which opens
/v1/load_lora_adapter and /v1/unload_lora_adapter (and SageMaker's adapter routes) on the API's port, so one
client request could unload the adapter users are served and another load any folder the server can read. Only
the evaluator may, and it runs in the same pod: it connects over the pod's loopback (127.0.0.1), which no client
reaches (a client's TCP peer address is its own; a Service keeps it, and the NetworkPolicy admits clients by it).

Why a middleware rather than a proxy in front or an API key: vLLM loads it into its own server (a documented
flag), so the serving path gets no extra hop, container or buffering (streamed replies go out as vLLM writes
them), and clients need no key; an allowlist, so any route a later vLLM adds stays closed until listed here.
`kubectl port-forward` arrives over the pod's loopback too: whoever may port-forward to the pod may exec into it.

Standard library only (an ASGI app is plain async Python); tests/test_client_endpoints.py runs it, and make e2e
(`adapters`) runs it inside vLLM's CPU server.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

# What clients are served: the OpenAI API's model list and generation, the probes' /health, Managed Prometheus'
# /metrics (its collectors are other pods), and the version.
CLIENT_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/version")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def from_this_pod(client: Any) -> bool:
    """A peer on the pod's loopback (the evaluator, a port-forward)."""
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


def client_path(path: str) -> bool:
    """One of CLIENT_PATHS, or below /v1/models (a model's own card)."""
    return path in CLIENT_PATHS or path.startswith("/v1/models/")


def allowed(scope: Scope) -> bool:
    return scope.get("type") not in ("http", "websocket") or from_this_pod(scope.get("client")) or client_path(
        str(scope.get("path", "")))


class ClientEndpoints:
    """The ASGI middleware vLLM adds with app.add_middleware(ClientEndpoints)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": f"{scope.get('path')} is not open to clients of this server (only "
                                                "the serving endpoints are); the pod's evaluator manages adapters",
                                     "type": "Forbidden", "code": 403}}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
