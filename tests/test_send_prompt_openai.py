"""send_prompt.py against an OpenAI-compatible server (vLLM): greedy decoding, vLLM's ignore_eos and
return_token_ids, the whole JSON answer. (Its MII requests are tested in test_serving.py.)"""

from __future__ import annotations

import http.server
import json
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import load_file

SEND_PROMPT = Path(__file__).resolve().parent.parent / "recipes" / "send_prompt.py"


@pytest.fixture(scope="module")
def send_prompt() -> types.ModuleType:
    return load_file(SEND_PROMPT, "send_prompt_openai")


def test_greedy_request_with_vllms_extensions(send_prompt: types.ModuleType) -> None:
    args = send_prompt.parse_args(["--openai", "--url", "http://10.0.0.5:8000/", "--model", "/models/ft",
                                   "--temperature", "0", "--ignore-eos", "--token-ids", "--max-new-tokens", "8", "hi"])
    request = send_prompt.build_request(args)
    assert request.full_url == "http://10.0.0.5:8000/v1/completions"
    # vLLM's CompletionRequest (0.32.0): temperature, ignore_eos and return_token_ids.
    assert json.loads(request.data) == {"model": "/models/ft", "prompt": "hi", "max_tokens": 8, "temperature": 0.0,
                                        "ignore_eos": True, "return_token_ids": True}


@pytest.mark.parametrize(("argv", "message"), [
    (["--deployment", "d", "--ignore-eos", "hi"], "--ignore-eos need --openai"),
    (["--deployment", "d", "--temperature", "0", "--token-ids", "hi"], "--temperature, --token-ids need --openai"),
    (["--openai", "--model", "m", "--temperature", "-1", "hi"], "--temperature must be 0 or more, got -1.0"),
])
def test_openai_settings_are_refused_where_they_mean_nothing(send_prompt: types.ModuleType, argv: list[str],
                                                             message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        send_prompt.parse_args(argv)
    assert message in capsys.readouterr().err


def test_json_prints_the_whole_answer(send_prompt: types.ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"choices": [{"index": 0, "text": " two", "token_ids": [7, 9], "prompt_token_ids": [0, 5]}],
              "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}
    seen: list[tuple[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            reply = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert send_prompt.main(["--openai", "--url", url, "--model", "m", "--json", "one plus one"]) == 0
        assert send_prompt.main(["--openai", "--url", url, "--model", "m", "one plus one"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] == ("/v1/completions", {"model": "m", "prompt": "one plus one", "max_tokens": 128})
    first, second = capsys.readouterr().out.splitlines()
    assert json.loads(first) == answer and second == " two"


def test_chat_sends_a_conversation_to_chat_completions(send_prompt: types.ModuleType) -> None:
    """--chat: vLLM's ChatCompletionRequest (0.32.0), the server rendering the messages through the served
    tokenizer's chat template; the prompt is the user's turn, after --system."""
    args = send_prompt.parse_args(["--openai", "--chat", "--url", "http://h:8000", "--model", "m", "--system", "Add.",
                                   "--temperature", "0", "--ignore-eos", "--token-ids", "--max-new-tokens", "4",
                                   "1+1?"])
    request = send_prompt.build_request(args)
    assert request.full_url == "http://h:8000/v1/chat/completions"
    assert json.loads(request.data) == {
        "model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "Add."},
                                                    {"role": "user", "content": "1+1?"}],
        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
    whole = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
             {"role": "user", "content": "2+2?"}]
    args = send_prompt.parse_args(["--openai", "--chat", "--model", "m", "--messages", json.dumps(whole)])
    assert json.loads(send_prompt.build_request(args).data)["messages"] == whole
    # A chat answer's text is its message's content.
    answer = {"choices": [{"message": {"role": "assistant", "content": "four"}, "token_ids": [5]}]}
    assert send_prompt.reply_text(True, answer, chat=True) == "four"


@pytest.mark.parametrize(("argv", "message"), [
    (["--deployment", "d", "--chat", "hi"], "--chat needs --openai"),
    (["--openai", "--model", "m", "--system", "s", "hi"], "--system need --chat"),
    (["--openai", "--chat", "--model", "m", "--messages", "[]"], "expected a list of"),
    (["--openai", "--chat", "--model", "m", "--messages", '[{"role": "user", "content": "a"}]', "hi"],
     "--messages is the whole conversation: give no prompt or --system beside it"),
    (["--openai", "--chat", "--model", "m"], "the prompt is required (or, with --chat, --messages)"),
])
def test_chat_settings_are_refused_where_they_mean_nothing(send_prompt: types.ModuleType, argv: list[str],
                                                           message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        send_prompt.parse_args(argv)
    assert message in capsys.readouterr().err
