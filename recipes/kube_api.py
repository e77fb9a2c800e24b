"""The Kubernetes API from inside a pod, with the pod's ServiceAccount token: GET, LIST, PATCH and POST, nothing more.

Used by reservation_end.py (the CronJob at a reservation's end) and maintenance_watch.py (the workers' sidecar).
Why not the official `kubernetes` client: neither image these run in carries it, the pinned version set
(data/versions.yaml) is not changed for two programs that make three kinds of request, and each request here is one
documented REST call (GET/PATCH on a named object, GET on a collection) with the in-cluster credentials every pod
gets (kubernetes.io/docs/tasks/run-application/access-api-from-pod: KUBERNETES_SERVICE_HOST/PORT, the token and
CA bundle under /var/run/secrets/kubernetes.io/serviceaccount).

`Api.request` is the one place that touches the network; tests give `Api` a `send` of their own.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"

# (method, path, body, content type) -> the decoded JSON answer; raises ApiError on a status >= 400.
Send = Callable[[str, str, Any, str | None], Any]


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def in_cluster_send(account: Path = ACCOUNT, timeout: float = 30.0) -> Send:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    base = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
    context = ssl.create_default_context(cafile=str(account / "ca.crt"))

    def send(method: str, path: str, body: Any, content_type: str | None) -> Any:
        # The token is read at each request: the kubelet rotates the projected token file.
        token = (account / "token").read_text(encoding="utf-8").strip()
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json",
            **({"Content-Type": content_type} if content_type else {})})
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, err.read().decode(errors="replace")[:500]) from None

    return send


class Api:
    def __init__(self, send: Send):
        self.request = send

    def get(self, path: str) -> Any:
        return self.request("GET", path, None, None)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> Any:
        return self.request("PATCH", path, body, content_type)

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body, "application/json")
