#!/usr/bin/env python3
"""Send one prompt to a deepspeed-stack `serve` workload (DeepSpeed-MII, or vLLM with --openai) and print the reply.

The server answers inside the cluster; reach it through `kubectl port-forward` (the stack's `servingEndpoints`
output prints the command for each workload):

    kubectl -n serving port-forward svc/chat 51080:51080 &
    python workloads/scripts/send_prompt.py --deployment chat "What is DeepSpeed?"

MII's RESTful API takes `POST /mii/<deployment>` with `{"prompts": [...], "max_new_tokens": N}` and answers a
list of `{"generated_text": ...}` (deepspeed-mii 0.3.3). With --openai the script calls an OpenAI-compatible
server instead (`POST /v1/completions`: vLLM's, or MII's with `serving.openai.enabled`), which wants the served
model's name (vLLM serving a folder names the model by its path):

    python workloads/scripts/send_prompt.py --openai --url http://localhost:8000 --model /models/ft \
        --temperature 0 --max-new-tokens 32 "What is DeepSpeed?"

--temperature 0 asks for greedy decoding; --ignore-eos and --token-ids are vLLM's extensions of the API (generate
all --max-new-tokens tokens; return the prompt's and the completion's token ids); --json prints the whole answer
(with its `usage`) instead of the text. Standard library only: it runs with any Python 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

DEFAULT_URL = "http://localhost:51080"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Send one prompt to a DeepSpeed-MII or OpenAI-compatible server")
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the server, e.g. a port-forward (default {DEFAULT_URL})")
    parser.add_argument("--deployment", help="the workload's name: MII's RESTful path is /mii/<deployment>")
    parser.add_argument("--openai", action="store_true", help="use the OpenAI-compatible /v1/completions instead")
    parser.add_argument("--model", help="with --openai: the served model (serving.model, or the path of modelPath)")
    parser.add_argument("--max-new-tokens", type=_positive, default=128, help="most tokens to generate (128)")
    parser.add_argument("--timeout", type=_positive, default=300, help="seconds to wait for the reply (300)")
    parser.add_argument("--temperature", type=float, help="with --openai: sampling temperature (0: greedy)")
    parser.add_argument("--ignore-eos", action="store_true", help="with --openai (vLLM): do not stop at EOS")
    parser.add_argument("--token-ids", action="store_true", help="with --openai (vLLM): return the token ids")
    parser.add_argument("--json", action="store_true", help="print the server's whole JSON answer")
    args = parser.parse_args(argv)
    if args.openai and not args.model:
        parser.error("--openai needs --model (the server answers only for the model it serves)")
    openai_only = [flag for flag, given in (("--temperature", args.temperature is not None),
                                            ("--ignore-eos", args.ignore_eos), ("--token-ids", args.token_ids))
                   if given]
    if openai_only and not args.openai:
        parser.error(f"{', '.join(openai_only)} need --openai (MII's RESTful API has no such settings)")
    if args.temperature is not None and args.temperature < 0:
        parser.error(f"--temperature must be 0 or more, got {args.temperature}")
    if not args.openai and not args.deployment:
        parser.error("--deployment is required (the workload's name, e.g. chat)")
    return args


def build_request(args: argparse.Namespace) -> urllib.request.Request:
    """The HTTP request for MII's RESTful API or its OpenAI-compatible server."""
    base = args.url.rstrip("/")
    if args.openai:
        url = f"{base}/v1/completions"
        body: dict[str, Any] = {"model": args.model, "prompt": args.prompt, "max_tokens": args.max_new_tokens}
        if args.temperature is not None:
            body["temperature"] = args.temperature
        if args.ignore_eos:
            body["ignore_eos"] = True
        if args.token_ids:
            body["return_token_ids"] = True
    else:
        url = f"{base}/mii/{args.deployment}"
        body = {"prompts": [args.prompt], "max_new_tokens": args.max_new_tokens}
    return urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                  headers={"Content-Type": "application/json"})


def reply_text(openai: bool, payload: Any) -> str:
    """The generated text from either API's JSON answer."""
    if openai:
        return "".join(choice.get("text", "") for choice in payload.get("choices", []))
    return "".join(item.get("generated_text", "") for item in payload)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    request = build_request(args)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            payload = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        print(f"{request.full_url}: HTTP {err.code}: {err.read().decode('utf-8', 'replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as err:
        print(f"{request.full_url}: {err.reason}; is the port-forward running (the `servingEndpoints` output "
              "prints it)?", file=sys.stderr)
        return 1
    print(json.dumps(payload) if args.json else reply_text(args.openai, payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
