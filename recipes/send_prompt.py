#!/usr/bin/env python3
"""Send one prompt to a deepspeed-stack `serve` workload (DeepSpeed-MII, or vLLM with --openai) and print the reply.

The server answers inside the cluster; reach it through `kubectl port-forward` (the stack's `servingEndpoints`
output prints the command for each workload):

    kubectl -n serving port-forward svc/chat 51080:51080 &
    python -m recipes.send_prompt --deployment chat "What is DeepSpeed?"

MII's RESTful API takes `POST /mii/<deployment>` with `{"prompts": [...], "max_new_tokens": N}` and answers a
list of `{"generated_text": ...}` (deepspeed-mii 0.3.3). With --openai the script calls an OpenAI-compatible
server instead (`POST /v1/completions`: vLLM's, or MII's with `serving.openai.enabled`), which wants the served
model's name (vLLM serving a folder names the model by its path):

    python -m recipes.send_prompt --openai --url http://localhost:8000 --model /models/ft \
        --temperature 0 --max-new-tokens 32 "What is DeepSpeed?"

--chat sends a conversation to `POST /v1/chat/completions` instead: the server renders it through the served
tokenizer's chat template, the way a model fine-tuned on chat data (finetune.recordFormat messages, or prompt/completion
records through an Instruct model's template) was trained. The prompt is the user's turn (with --system before it),
or --messages gives the whole conversation as a JSON list of {"role", "content"}:

    python -m recipes.send_prompt --openai --chat --url http://localhost:8000 --model /models/ft \
        --system "You add numbers." "What is two plus three?"

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

from recipes.contract_programs import SEND_PROMPT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = SEND_PROMPT.parser(types={"messages": _messages})
    # Positional, so not an option of the declaration (the stack quotes the prompt for a shell itself).
    parser.add_argument("prompt", nargs="?", help="the prompt text (with --chat: the user's turn)")
    args = parser.parse_args(argv)
    if args.openai and not args.model:
        parser.error("--openai needs --model (the server answers only for the model it serves)")
    openai_only = [flag for flag, given in (("--temperature", args.temperature is not None),
                                            ("--ignore-eos", args.ignore_eos), ("--token-ids", args.token_ids))
                   if given]
    if openai_only and not args.openai:
        parser.error(f"{', '.join(openai_only)} need --openai (MII's RESTful API has no such settings)")
    if args.chat and not args.openai:
        parser.error("--chat needs --openai (MII's RESTful API takes prompts only)")
    chat_only = [flag for flag, given in (("--system", args.system is not None), ("--messages", args.messages))
                 if given]
    if chat_only and not args.chat:
        parser.error(f"{', '.join(chat_only)} need --chat")
    if args.messages and (args.prompt is not None or args.system is not None):
        parser.error("--messages is the whole conversation: give no prompt or --system beside it")
    if not args.messages and args.prompt is None:
        parser.error("the prompt is required (or, with --chat, --messages)")
    for problem in SEND_PROMPT.problems(args):  # --temperature: 0 or more
        parser.error(problem)
    if not args.openai and not args.deployment:
        parser.error("--deployment is required (the workload's name, e.g. chat)")
    return args


def _messages(text: str) -> list[dict[str, str]]:
    """--messages: a JSON list of messages, each with a role and text content."""
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg})") from None
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise argparse.ArgumentTypeError('expected a list of {"role": ..., "content": ...} with text content')
    return messages


def conversation(args: argparse.Namespace) -> list[dict[str, str]]:
    """--chat's messages: --messages, or the system turn (if any) and the prompt as the user's."""
    if args.messages:
        return list(args.messages)
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    return [*system, {"role": "user", "content": args.prompt}]


def build_request(args: argparse.Namespace) -> urllib.request.Request:
    """The HTTP request for MII's RESTful API or its OpenAI-compatible server."""
    base = args.url.rstrip("/")
    if args.openai:
        url = f"{base}/v1/chat/completions" if args.chat else f"{base}/v1/completions"
        body: dict[str, Any] = {"model": args.model, "max_tokens": args.max_new_tokens}
        body.update({"messages": conversation(args)} if args.chat else {"prompt": args.prompt})
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


def reply_text(openai: bool, payload: Any, chat: bool = False) -> str:
    """The generated text from either API's JSON answer (a chat answer's is each choice's message content)."""
    if chat:
        return "".join((choice.get("message") or {}).get("content") or "" for choice in payload.get("choices", []))
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
    print(json.dumps(payload) if args.json else reply_text(args.openai, payload, args.chat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
