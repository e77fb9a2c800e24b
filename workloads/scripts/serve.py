#!/usr/bin/env python3
"""DeepSpeed-MII (FastGen) persistent server of a deepspeed-stack `serve` workload.

Shipped in the workload's ConfigMap and run by its Deployment as `python /app/serve.py ARGS`; the stack writes
ARGS (workloads/serving.py, `server_args`). Written against deepspeed-mii 0.3.3 (the image pins it). It

1. answers `/ready` and `/live` on --health-port from the start: `/ready` is 503 until the model is loaded;
2. starts MII's persistent deployment with its RESTful API on --port (`mii.serve`, which returns only once every
   tensor-parallel rank has loaded the model and MII's load balancer answers);
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
from collections.abc import Callable
from typing import Any

LOCALHOST = "127.0.0.1"
MII_LOAD_BALANCER_PORT = 50050  # deepspeed-mii's default `port_number`
CHECK_SECONDS = 10.0
# FastGen's default max_context (deepspeed 0.16.4, DSStateManagerConfig): tokens one sequence may hold.
FASTGEN_MAX_CONTEXT = 8192


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DeepSpeed-MII persistent server with its RESTful API")
    parser.add_argument("--model", required=True, help="Hugging Face model id, or a folder with the checkpoint")
    parser.add_argument("--deployment-name", required=True, help="MII deployment name (REST path /mii/NAME)")
    parser.add_argument("--tensor-parallel", type=_positive, default=1, help="GPUs the model is split over")
    parser.add_argument("--max-length", type=_positive, default=None,
                        help="most tokens (prompt + generated) of one sequence")
    parser.add_argument("--host", default="0.0.0.0", help="address the APIs listen on")
    parser.add_argument("--port", type=_port, default=51080, help="MII's RESTful API port")
    parser.add_argument("--health-port", type=_port, default=8081, help="/ready and /live for the probes")
    parser.add_argument("--openai-port", type=_port, default=None, help="also start the OpenAI-compatible server")
    parser.add_argument("--load-balancer-port", type=_port, default=MII_LOAD_BALANCER_PORT,
                        help="MII's internal load balancer port")
    return parser.parse_args(argv)


def serve_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`mii.serve`'s keyword arguments: one replica per pod (Kubernetes makes more), the RESTful API on."""
    kwargs: dict[str, Any] = {
        "model_name_or_path": args.model,
        "deployment_name": args.deployment_name,
        "tensor_parallel": args.tensor_parallel,
        "replica_num": 1,
        "enable_restful_api": True,
        "restful_api_host": args.host,
        "restful_api_port": args.port,
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


class Health:
    """What the probes see: ready once the model is loaded and the load balancer answers; live unless a loaded
    server has gone away."""

    def __init__(self, load_balancer_port: int, port_check: Callable[[int], bool] = port_open):
        self.loaded = threading.Event()
        self.failure: str | None = None
        self._port = load_balancer_port
        self._port_check = port_check

    def ready(self) -> bool:
        return self.loaded.is_set() and self.failure is None and self._port_check(self._port)

    def live(self) -> bool:
        return self.failure is None and (not self.loaded.is_set() or self._port_check(self._port))


def health_server(health: Health, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """GET /ready and /live: 200 or 503. Probes come every few seconds, so requests are not logged."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name BaseHTTPRequestHandler calls
            checks = {"/ready": health.ready, "/live": health.live}
            if self.path not in checks:
                self.send_error(404)
                return
            ok = checks[self.path]()
            body = b"ok\n" if ok else b"not yet\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    # A short poll interval: shutdown() on SIGTERM returns at once instead of after up to half a second.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="health", daemon=True).start()
    return server


def log(message: str) -> None:
    print(f"serve.py: {message}", flush=True)


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    problem = gpu_problem(args.tensor_parallel, visible_gpus())
    if problem:
        log(problem)
        return 2
    health = Health(args.load_balancer_port)
    server = health_server(health, args.host, args.health_port)
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
            if not port_open(args.load_balancer_port):
                health.failure = "MII's load balancer stopped answering"
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
