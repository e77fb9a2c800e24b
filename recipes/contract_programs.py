"""The contract's declarations of the programs the stack runs beside training and serving, one `Program` each
(recipes/contract.py holds `Option` and `Program`, finetune.py's and maintenance_watch.py's): each option's flag,
stack key, type, default, bounds and help, in the order the stack renders them, so that a renamed flag changes here
and nowhere else.

Two kinds of program:
- those that build their parser from their declaration import this module, so it ships beside them with contract.py
  (CONTRACT_FILES): evaluate.py, evaluator.py and adapter_loader.py (the evaluator's ConfigMap), serve.py (MII's), and
  send_prompt.py (run from a checkout). PROGRAMS names them, finetune.py and maintenance_watch.py;
- those shipped alone, or with the package's __init__ only, keep their own argparse parser: stop_ranks.py (a Gaudi
  job's ConfigMap, Vertex AI's bucket), reservation_end.py (its own ConfigMap) and nccl_bench.py (the NCCL test's).
  OWN_PARSERS names them: the stack renders their argv from the declaration here, and tests/test_recipe_contract.py
  holds each program's parser to it (flags, types, defaults, help) and parses what the stack renders with it.

Standard library only, and nothing of the stack, as contract.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recipes.contract import FINETUNE, MAINTENANCE_WATCH, SWITCH, Option, Program, positive_int

# What a program importing this module needs beside it (with the package's __init__: contract.sources).
CONTRACT_FILES = ("contract.py", "contract_programs.py")


def tcp_port(text: str) -> int:
    """argparse's type for a TCP port."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def _evaluation(key: str) -> tuple[str, ...]:
    return ("serving", "evaluation", key)


# --- evaluate.py and evaluator.py (serving.evaluation) --------------------------------------------------------------

LOGLIKELIHOOD, EXACT_MATCH = "loglikelihood", "exact_match"
EVAL_METRICS = (LOGLIKELIHOOD, EXACT_MATCH)  # what the gate may read (evaluate_task.py METRICS: both are scored)
EVAL_MAX_TOKENS = 32
EVAL_MAX_LENGTH = 2048  # lm-eval's own default: prompts longer than this less the reply are cut on the left

EVALUATE = Program("evaluate", options=(
    Option(("--url",), required=True, help="the server's root, e.g. http://127.0.0.1:8000"),
    Option(("--base",), required=True, help="the base model's name in the server's API"),
    Option(("--adapter",), required=True, help="the name the tuned adapter is served under"),
    Option(("--candidate",), required=True, help="the adapter's folder (MODEL_DIR of the finetune workload)"),
    Option(("--task",), required=True, help="the held-out task: JSON lines in a format training takes"),
    Option(("--results",), required=True, help="where results.json goes (served.json, versions/ beside)"),
    Option(("--max-tokens",), int, default=EVAL_MAX_TOKENS, minimum=1, help="tokens generated per prompt"),
    Option(("--max-length",), int, default=EVAL_MAX_LENGTH, help="the server's max model length"),
    # The gate's bounds, serving.evaluation.minImprovement's (model/schema.yaml; tests/test_evaluate.py holds them
    # equal): a negative gate would serve an export worse than the one served now. evaluate.py words them.
    Option(("--min-improvement",), float, minimum=0.0, maximum=1.0,
           help="the gate: at least this much better, or not served"),
    Option(("--metric",), choices=EVAL_METRICS,
           help="what the gate reads (default: loglikelihood for chat-trained exports, exact_match for raw ones)"),
))

EVALUATOR = Program("evaluator", options=(
    Option(("--url",), required=True, help="the server's root, e.g. http://127.0.0.1:8000"),
    Option(("--base",), required=True, help="the base model's name in the server's API"),
    Option(("--task",), required=True, key=_evaluation("task"),
           help="the held-out task (JSON lines in a format training takes)"),
    Option(("--evals",), required=True, help="the bucket's evals/ folder (EVALS/NAME/results.json)"),
    Option(("--max-tokens",), int, default=EVAL_MAX_TOKENS, key=_evaluation("maxTokens"),
           help="tokens generated per prompt"),
    Option(("--max-length",), int, default=EVAL_MAX_LENGTH, key=("model", "sequenceLength"),
           help="the server's max model length"),
    Option(("--min-improvement",), float, key=_evaluation("minImprovement"),
           help="the gate (evaluate.py --min-improvement)"),
    Option(("--metric",), choices=EVAL_METRICS, key=_evaluation("metric"),
           help="what the gate reads (evaluate.py --metric; default by the export's rendering)"),
    # NAME=MODEL_DIR: evaluator.py reads it into its own Adapter (Program.parser's `types`).
    Option(("--adapter",), required=True, repeat=True, help="NAME=MODEL_DIR of each adapter the server serves"),
    Option(("--poll",), float, default=30, help="seconds between passes"),
    Option(("--retry",), float, default=600, help="seconds before a failed one again"),
    Option(("--once",), SWITCH, help="one pass, then exit (1 if the server is down)"),
))

ADAPTER_LOADER = Program("adapter_loader", options=(
    Option(("--url",), required=True, help="vLLM's root on the pod's loopback, e.g. http://127.0.0.1:8000"),
    Option(("--evals",), Path, required=True, help="the bucket's evals/ folder (read-only)"),
    Option(("--ready",), Path, default=Path("/tmp/adapter-loader/ready"), help="the file the readiness probe reads"),
    Option(("--adapter",), required=True, repeat=True, help="an adapter NAME the server serves"),
    Option(("--poll",), float, default=15, help="seconds between passes"),
    Option(("--once",), SWITCH, help="one pass, then exit: 0 when every decision is served"),
))

# --- serve.py (engine mii) and send_prompt.py -----------------------------------------------------------------------

MII_LOAD_BALANCER_PORT = 50050  # deepspeed-mii's default `port_number`
MII_GATEWAY_PORT = 28080  # MII's RESTful gateway, on 127.0.0.1 only (data/serving.yaml mii.ports.gatewayInternal)

# The programs below always took abbreviated flags (argparse's default): they still do.
SERVE = Program("serve", abbrev=True, description="DeepSpeed-MII persistent server with its RESTful API.", options=(
    Option(("--model",), required=True, help="Hugging Face model id, or a folder with the checkpoint"),
    Option(("--deployment-name",), required=True, help="MII deployment name (REST path /mii/NAME)"),
    Option(("--tensor-parallel",), positive_int, default=1, help="GPUs the model is split over"),
    Option(("--port",), tcp_port, default=51080,
           help="the served port: POST /mii/<deployment> (forwarded to MII's gateway) and GET /health"),
    Option(("--gateway-port",), tcp_port, default=MII_GATEWAY_PORT, help="MII's RESTful gateway, on 127.0.0.1 only"),
    Option(("--max-length",), positive_int, key=("model", "sequenceLength"),
           help="most tokens (prompt + generated) of one sequence"),
    Option(("--openai-port",), tcp_port, key=("serving", "openai", "port"),
           help="also start the OpenAI-compatible server"),
    Option(("--host",), default="0.0.0.0", help="address the APIs listen on"),
    Option(("--load-balancer-port",), tcp_port, default=MII_LOAD_BALANCER_PORT,
           help="MII's internal load balancer port"),
))

SEND_PROMPT_URL = "http://localhost:51080"
# The prompt itself is positional: send_prompt.py adds it, and the stack quotes it for a shell itself.
SEND_PROMPT = Program("send_prompt", abbrev=True,
                      description="Send one prompt to a DeepSpeed-MII or OpenAI-compatible server.", options=(
    Option(("--openai",), SWITCH, help="use the OpenAI-compatible /v1/completions instead"),
    Option(("--chat",), SWITCH, help="with --openai: /v1/chat/completions, a conversation"),
    Option(("--url",), default=SEND_PROMPT_URL, help=f"the server, e.g. a port-forward (default {SEND_PROMPT_URL})"),
    Option(("--deployment",), help="the workload's name: MII's RESTful path is /mii/<deployment>"),
    Option(("--model",), help="with --openai: the served model (serving.model, or the path of modelPath)"),
    Option(("--system",), help="with --chat: a system turn before the prompt"),
    # A JSON list of messages: send_prompt.py reads it (Program.parser's `types`).
    Option(("--messages",), help="with --chat: the whole conversation, a JSON list of "
                                 "{\"role\": ..., \"content\": ...} (instead of the prompt)"),
    Option(("--max-new-tokens",), positive_int, default=128, help="most tokens to generate (128)"),
    Option(("--timeout",), positive_int, default=300, help="seconds to wait for the reply (300)"),
    Option(("--temperature",), float, minimum=0, help="with --openai: sampling temperature (0: greedy)"),
    Option(("--ignore-eos",), SWITCH, help="with --openai (vLLM): do not stop at EOS"),
    Option(("--token-ids",), SWITCH, help="with --openai (vLLM): return the token ids"),
    Option(("--json",), SWITCH, help="print the server's whole JSON answer"),
))

# --- the programs with their own parser (see the module's docstring) -----------------------------------------------

STOP_RANKS = Program("stop_ranks", abbrev=True, options=(
    Option(("--timeout",), float, default=600.0, help="seconds to wait for the ranks"),
), hidden=(Option(("--proc",), Path, default=Path("/proc")),))  # the tests' stand-in /proc

RESERVATION_END = Program("reservation_end", abbrev=True, options=(
    Option(("--queue",), required=True, help="the ClusterQueue"),
    Option(("--flavor",), required=True, help="the reservation's ResourceFlavor"),
    Option(("--index",), int, required=True, help="its index in the GPU resource group"),
    Option(("--end",), required=True, help="the reservation's end, RFC 3339 with its zone"),
    Option(("--namespaces",), required=True, help="comma-separated: where jobs that may use the flavor run"),
    Option(("--kueue-api",), default="kueue.x-k8s.io/v1beta2"),
    Option(("--window-seconds",), float, default=7 * 86400.0),
    Option(("--wait-seconds",), float, default=900.0),
    Option(("--poll-seconds",), float, default=5.0),
))

# Sizes are text here (1Mi, 8Gi: the stack's form); nccl_bench.py reads them, and the pass line, with its own types.
NCCL_BENCH = Program("nccl_bench", abbrev=True, options=(
    Option(("--benchmarks",), default="all_gather,all_reduce",
           help="comma-separated, of all_gather, all_reduce, reduce_scatter"),
    Option(("--min-bytes",), default="1Mi"),
    Option(("--max-bytes",), default="8Gi"),
    Option(("--iters",), int, default=20),
    Option(("--warmup",), int, default=5),
    Option(("--expect-nccl",), help="the NCCL the image ships (fail on another)"),
    Option(("--min-nccl",), help="the oldest NCCL the fabric's plugin works with (fail below)"),
    Option(("--qualified-nccl",), help="the NCCL Google qualifies the fabric's plugin with (reported)"),
    Option(("--pass-line",), help="BENCHMARK:GBPS:MIN:MAX: fail when BENCHMARK's average bus bandwidth over MIN..MAX "
                                  "is below GBPS"),
    Option(("--pass-line-note",), default="", help="where the pass line comes from (for the log)"),
))

# The programs whose parser is built from their declaration, by file name (workloads/script_flags.py reads their
# flags from it), and those that keep their own (the stack renders their argv from the declaration all the same).
PROGRAMS = {"finetune.py": FINETUNE, "maintenance_watch.py": MAINTENANCE_WATCH, "evaluate.py": EVALUATE,
            "evaluator.py": EVALUATOR, "adapter_loader.py": ADAPTER_LOADER, "serve.py": SERVE,
            "send_prompt.py": SEND_PROMPT}
OWN_PARSERS = {"stop_ranks.py": STOP_RANKS, "reservation_end.py": RESERVATION_END, "nccl_bench.py": NCCL_BENCH}
