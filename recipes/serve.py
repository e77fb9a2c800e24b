#!/usr/bin/env python3
"""DeepSpeed-MII (FastGen) persistent server of a deepspeed-stack `serve` workload (`serving.engine: mii`).

Shipped in the workload's ConfigMap and run by its Deployment as `python /app/serve.py ARGS`; the stack writes
ARGS (workloads/serving.py, `mii_args`). Written against deepspeed-mii 0.3.3 (the image pins it). It

1. starts MII's persistent deployment (`mii.serve`, which returns only once every tensor-parallel rank has loaded
   the model and MII's load balancer answers) with MII's RESTful gateway on 127.0.0.1:--gateway-port only: that
   gateway also serves an unauthenticated `GET /terminate` (mii/grpc_related/restful_gateway.py), which nobody
   outside the pod may reach;
2. serves on --port, the port the Service exposes, only `POST /mii/<deployment>` (forwarded to the gateway) and
   `GET /health`: 200 while the gateway answers `/healthz` and every model process (the load balancer and one
   model server per rank) accepts connections, 503 before the model is loaded or once any of them is gone. The
   Deployment's probes call it, so they fail when the served port or the model stops answering;
3. with --openai-port, starts MII's OpenAI-compatible server against that deployment's load balancer;
4. runs until SIGTERM (or until the server goes away: then it exits non-zero and Kubernetes restarts the pod).

The Hugging Face token, when there is one, is a mounted file that HF_TOKEN_PATH names; it never passes through
this script.
"""

from __future__ import annotations

import argparse
import http.server
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from recipes.contract_programs import SERVE

LOCALHOST = "127.0.0.1"
CHECK_SECONDS = 10.0
# A generation of many tokens on a busy server takes minutes; the client's own timeout decides before this.
FORWARD_TIMEOUT_SECONDS = 600
# FastGen's default max_context (deepspeed 0.16.4, DSStateManagerConfig): tokens one sequence may hold.
FASTGEN_MAX_CONTEXT = 8192


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return SERVE.parser().parse_args(argv)


def serve_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`mii.serve`'s keyword arguments: one replica per pod (Kubernetes makes more), the RESTful API on."""
    kwargs: dict[str, Any] = {
        "model_name_or_path": args.model,
        "deployment_name": args.deployment_name,
        "tensor_parallel": args.tensor_parallel,
        "replica_num": 1,
        "enable_restful_api": True,
        # Loopback only: the gateway's GET /terminate must not be reachable from the network (see the docstring).
        "restful_api_host": LOCALHOST,
        "restful_api_port": args.gateway_port,
        "port_number": args.load_balancer_port,
    }
    if args.max_length:
        kwargs["max_length"] = args.max_length
    if args.max_length and args.max_length > FASTGEN_MAX_CONTEXT:
        # A longer sequence than FastGen's default bound on one sequence: raise the bound with it.
        kwargs["inference_engine_config"] = {"state_manager": {"max_context": args.max_length}}
    return kwargs


def openai_command(args: argparse.Namespace) -> list[str]:
    """MII's OpenAI-compatible server, attached to the running deployment through its load balancer."""
    return [sys.executable, "-m", "mii.entrypoints.openai_api_server", "--model", args.model,
            "--deployment-name", args.deployment_name, "--load-balancer", f"localhost:{args.load_balancer_port}",
            "--host", args.host, "--port", str(args.openai_port)]


def gpu_problem(tensor_parallel: int, visible: int) -> str | None:
    if visible < tensor_parallel:
        return (f"--tensor-parallel {tensor_parallel} needs {tensor_parallel} GPUs, but this pod sees {visible}; "
                "check the pod's nvidia.com/gpu limit and the node's driver")
    return None


def visible_gpus() -> int:
    import torch  # the image's; imported here so that --help and the tests need no torch

    return torch.cuda.device_count()


def port_open(port: int, host: str = LOCALHOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) == 0


def gateway_answers(port: int) -> bool:
    """MII's gateway answers its own GET /healthz (restful_gateway.py)."""
    try:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def model_ports(load_balancer_port: int, tensor_parallel: int) -> list[int]:
    """The model processes MII starts: its load balancer and one model server per rank after it (mii/config.py)."""
    return [load_balancer_port, *(load_balancer_port + 1 + rank for rank in range(tensor_parallel))]


class Health:
    """What the probes see: healthy once the model is loaded, while the gateway and every model process answer."""

    def __init__(self, gateway_port: int, ports: list[int], port_check: Callable[[int], bool] = port_open,
                 gateway_check: Callable[[int], bool] = gateway_answers):
        self.loaded = threading.Event()
        self.failure: str | None = None
        self._gateway, self._ports = gateway_port, ports
        self._port_check, self._gateway_check = port_check, gateway_check

    def problem(self) -> str | None:
        """Why the server is not healthy, or None."""
        if self.failure:
            return self.failure
        if not self.loaded.is_set():
            return "loading the model"
        if not self._gateway_check(self._gateway):
            return "MII's RESTful gateway does not answer"
        down = [p for p in self._ports if not self._port_check(p)]
        return f"MII's model processes on ports {down} do not answer" if down else None


def api_server(health: Health, host: str, port: int, rest_path: str, gateway_port: int,
               forward_timeout: float = FORWARD_TIMEOUT_SECONDS) -> http.server.ThreadingHTTPServer:
    """The served port: POST `rest_path` forwarded to MII's gateway, GET /health; anything else (MII's
    /terminate above all) is 404. Probes come every few seconds, so requests are not logged."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # the name BaseHTTPRequestHandler calls
            if self.path != "/health":
                self._reply(404, b"not found\n")
                return
            problem = health.problem()
            self._reply(503 if problem else 200, f"{problem or 'ok'}\n".encode())

        def do_POST(self) -> None:
            if self.path != rest_path:
                self._reply(404, b"not found\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = urllib.request.Request(f"http://{LOCALHOST}:{gateway_port}{rest_path}", data=body,
                                             headers={"Content-Type": self.headers.get("Content-Type",
                                                                                       "application/json")})
            try:
                with urllib.request.urlopen(request, timeout=forward_timeout) as response:
                    self._reply(response.status, response.read(), response.headers.get("Content-Type", "text/plain"))
            except urllib.error.HTTPError as err:
                self._reply(err.code, err.read(), err.headers.get("Content-Type", "text/plain"))
            except (urllib.error.URLError, OSError) as err:
                self._reply(502, f"MII's gateway: {err}\n".encode())

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    # A short poll interval: shutdown() on SIGTERM returns at once instead of after up to half a second.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="api", daemon=True).start()
    return server


def log(message: str) -> None:
    print(f"serve.py: {message}", flush=True)


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    problem = gpu_problem(args.tensor_parallel, visible_gpus())
    if problem:
        log(problem)
        return 2
    health = Health(args.gateway_port, model_ports(args.load_balancer_port, args.tensor_parallel))
    server = api_server(health, args.host, args.port, f"/mii/{args.deployment_name}", args.gateway_port)
    client, openai = None, None
    try:
        import mii  # deepspeed-mii from the image

        log(f"loading {args.model} over {args.tensor_parallel} GPU(s) as deployment {args.deployment_name}")
        client = mii.serve(**serve_kwargs(args))
        if args.openai_port:
            openai = subprocess.Popen(openai_command(args))
        health.loaded.set()
        log(f"ready: POST http://{args.host}:{args.port}/mii/{args.deployment_name}")
        while not stop.wait(CHECK_SECONDS):
            down = [p for p in model_ports(args.load_balancer_port, args.tensor_parallel) if not port_open(p)]
            if down:
                health.failure = f"MII's model processes on ports {down} stopped answering"
            elif openai is not None and openai.poll() is not None:
                health.failure = f"the OpenAI-compatible server exited with {openai.returncode}"
            if health.failure:
                log(health.failure)
                return 1
        return 0
    finally:
        server.shutdown()
        if openai is not None and openai.poll() is None:
            openai.terminate()
        if client is not None:
            try:
                client.terminate_server()
            except Exception as err:  # shutting down: report it and go on
                log(f"stopping MII: {err}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return run(args, stop)


if __name__ == "__main__":
    sys.exit(main())
