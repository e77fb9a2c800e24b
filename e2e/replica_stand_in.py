"""A second replica of the `adapters` scenario's server, standing in for a vLLM process the e2e cannot afford (a
vLLM CPU start is about 45 s of the 4-minute budget): the part of vLLM's OpenAI server the fleet's adapter loader
(recipes/adapter_loader.py) talks to, following vLLM's rules for it (vllm 0.32,
vllm/entrypoints/openai/models/serving.py):

    python3 e2e/replica_stand_in.py PORT BASE_NAME

- GET /health: 200;
- GET /v1/models: the base (no `parent`) and each loaded adapter as vLLM lists a LoRA: `id` its name, `root` the
  path it was loaded from, `parent` the base;
- POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}: 400 when the name is served and load_inplace is
  not true ("already been loaded"), 404 when lora_path is not an adapter folder (no adapter_config.json: vLLM fails
  to load it), else the adapter is served from that path;
- POST /v1/unload_lora_adapter {lora_name}: 404 when the name is not served, else it is no longer served.
Standard library only: it runs with the image's python on a host of its own.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SERVED: dict[str, str] = {}  # adapter name -> the path it was loaded from
BASE = ""


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # http.server names its handlers so
        if self.path == "/health":
            self._answer(200, {})
        elif self.path == "/v1/models":
            models = [{"id": BASE, "object": "model", "root": BASE, "parent": None}]
            models += [{"id": name, "object": "model", "root": path, "parent": BASE} for name, path in SERVED.items()]
            self._answer(200, {"object": "list", "data": models})
        else:
            self._answer(404, {"error": self.path})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        name = body.get("lora_name", "")
        if self.path == "/v1/load_lora_adapter":
            path = body.get("lora_path", "")
            if name in SERVED and body.get("load_inplace") is not True:
                self._answer(400, {"error": f"The lora adapter '{name}' has already been loaded."})
            elif not (Path(path) / "adapter_config.json").is_file():
                self._answer(404, {"error": f"No adapter found for {path}"})
            else:
                SERVED[name] = path
                self._answer(200, f"Success: LoRA adapter '{name}' added successfully.")
        elif self.path == "/v1/unload_lora_adapter":
            if SERVED.pop(name, None) is None:
                self._answer(404, {"error": f"The lora adapter '{name}' cannot be found."})
            else:
                self._answer(200, f"Success: LoRA adapter '{name}' removed successfully.")
        else:
            self._answer(404, {"error": self.path})

    def log_message(self, format: str, *args: Any) -> None:
        sys.stdout.write(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    BASE = sys.argv[2]
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
