"""The DeepSpeed image: lint, the Bitnami chart contract, entrypoint.sh behaviour, smoke_train.py helpers.

No Docker engine is needed: the Dockerfile is linted with hadolint and checked as text, the shell
scripts run under bash in subprocesses, and smoke_train.py's helpers are imported without torch.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent
IMAGE_DIR = ROOT / "workloads" / "images" / "deepspeed"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
SMOKE_TEST = ROOT / "recipes" / "smoke_train.py"
CHART_ENTRYPOINT = "/opt/bitnami/scripts/deepspeed/entrypoint.sh"


def tool(name: str) -> str:
    """A linter from the project's venv (beside the running python) or PATH; skip when absent."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (neither in {candidate.parent} nor on PATH)")
    return found


def bash() -> str:
    found = shutil.which("bash")
    if found is None:
        pytest.skip("bash is not installed")
    return found


# --------------------------------------------------------------------------------------------
# Dockerfile as data
# --------------------------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            result.append((keyword.upper(), args.strip()))
    return result


def env_values(parsed: list[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for keyword, args in parsed:
        if keyword == "ENV":
            for item in shlex.split(args):
                name, sep, value = item.partition("=")
                assert sep, f"use the ENV key=value form: {item!r}"
                values[name] = value
    return values


def arg_defaults(parsed: list[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for keyword, args in parsed:
        if keyword == "ARG":
            name, _, value = args.partition("=")
            values[name] = value.strip('"')
    return values


@pytest.fixture(scope="module")
def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text(encoding="utf-8"))


def runs(parsed: list[tuple[str, str]]) -> str:
    return "\n".join(args for keyword, args in parsed if keyword == "RUN")


def test_hadolint_passes() -> None:
    hadolint = tool("hadolint")
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_ignores_are_few_and_explained() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    assert len(ignores) <= 2
    for index in ignores:
        assert lines[index - 1].lstrip().startswith("#"), "explain an ignored rule in the comment above it"


SHELL_SCRIPTS = sorted((ROOT / "workloads").rglob("*.sh"))


def test_shell_scripts_found() -> None:
    names = {path.name for path in SHELL_SCRIPTS}
    assert {"entrypoint.sh", "vertex_start.sh"} <= names


@pytest.mark.parametrize("follow", [False, True], ids=["plain", "external-sources"])
def test_shellcheck_passes(follow: bool) -> None:
    # One run over every script (shellcheck reports per file); with and without following `source`.
    shellcheck = tool("shellcheck")
    command = [shellcheck, *(["-x"] if follow else []), *(str(path) for path in SHELL_SCRIPTS)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_images_are_pinned(parsed: list[tuple[str, str]]) -> None:
    bases = [args.split()[0] for keyword, args in parsed if keyword == "FROM"]
    assert bases
    for image in bases:
        assert "$" not in image, "pin the base image in the FROM line itself"
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name and tag and tag != "latest", f"unpinned base image {image}"
        assert re.match(r"\d+\.\d+\.\d+", tag), f"base tag {tag} should carry a full CUDA version"
    # CUDA 13: the release torch 2.13.0's PyPI wheel is built with (tests/test_versions.py pins the exact tag).
    assert bases[-1].startswith("nvidia/cuda:13.")


def test_runs_as_1001_in_app(parsed: list[tuple[str, str]]) -> None:
    users = [args for keyword, args in parsed if keyword == "USER"]
    assert users and users[-1] == "1001"
    workdirs = [args for keyword, args in parsed if keyword == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/app"


def test_deepspeed_user_has_home_and_shell(parsed: list[tuple[str, str]]) -> None:
    run = runs(parsed)
    useradd = next(line for line in run.split("&&") if "useradd" in line)
    assert "--uid 1001" in useradd
    assert "--home-dir /home/deepspeed" in useradd
    assert "--shell /bin/bash" in useradd
    assert re.search(r"useradd .*\bdeepspeed\s*$", useradd.strip())
    # A locked account ("!" password) is refused by sshd even for key logins without PAM.
    assert "--password '*'" in useradd


def test_env_for_workers(parsed: list[tuple[str, str]]) -> None:
    env = env_values(parsed)
    path = env["PATH"].split(":")
    for directory in ("/opt/venv/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/sbin"):
        assert directory in path
    assert path[0] == "/opt/venv/bin", "the venv's python must win over any system python"
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")
    assert env["TRITON_CACHE_DIR"].startswith("/home/deepspeed/.cache/")
    assert env["PDSH_RCMD_TYPE"] == "ssh"
    for name in ("TORCH_EXTENSIONS_DIR", "HF_HOME"):
        assert env[name].startswith("/home/deepspeed/.cache/"), "only ~/.cache is writable in the pods"


def test_entrypoint_and_vertex_files_copied(parsed: list[tuple[str, str]]) -> None:
    copies = [args.split() for keyword, args in parsed if keyword == "COPY"]
    destinations = {}
    for words in copies:
        sources = [word for word in words[:-1] if not word.startswith("--")]
        for source in sources:
            destinations[source] = words[-1]
            assert (IMAGE_DIR / source).is_file(), f"COPY source {source} is missing from the context"
    assert destinations["entrypoint.sh"] == CHART_ENTRYPOINT
    assert destinations["vertex_start.sh"].startswith("/opt/deepspeed/vertex")
    assert destinations["vertex_cluster.py"].startswith("/opt/deepspeed/vertex")
    assert "smoke_train.py" not in destinations, "the smoke test ships in the chart's source ConfigMap"


def test_dockerignore_keeps_only_copied_files() -> None:
    lines = [
        line.strip()
        for line in (IMAGE_DIR / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert set(lines[1:]) == {"!entrypoint.sh", "!vertex_start.sh", "!vertex_cluster.py"}


def test_packages_and_no_driver(parsed: list[tuple[str, str]]) -> None:
    run = runs(parsed)
    # procps: the chart's worker liveness probe runs `pgrep -f sshd`.
    for package in ("openssh-server", "openssh-client", "pdsh", "procps"):
        assert re.search(rf"\b{package}\b", run), f"{package} is not installed"
    assert not re.search(r"nvidia-driver|libnvidia-compute|cuda-drivers|nvidia-utils", run)
    # The openssh-server package generates host keys; none may ship in the image.
    assert re.search(r"rm -f[^&]*/etc/ssh/ssh_host_\*", run)


def test_python_packages_pinned(parsed: list[tuple[str, str]]) -> None:
    args = arg_defaults(parsed)
    for name in ("TORCH_VERSION", "NCCL_VERSION", "DEEPSPEED_VERSION", "TRANSFORMERS_VERSION", "ACCELERATE_VERSION",
                 "PEFT_VERSION", "DATASETS_VERSION", "VLLM_VERSION", "DEEPSPEED_MII_VERSION"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", args[name]), f"{name} is not pinned"
    for match in re.finditer(r"pip install ([^&\n]*)", runs(parsed)):
        for word in match.group(1).split():
            word = word.strip('"')
            if word.startswith(("-", "${", "http")):
                continue
            assert "==" in word, f"unpinned pip package {word}"


def test_ssh_configuration(parsed: list[tuple[str, str]]) -> None:
    run = runs(parsed)
    assert "Include /etc/ssh/sshd_config.d/*.conf" in run
    assert "Include /etc/ssh/ssh_config.d/*.conf" in run
    for setting in ("Port 2222", "PermitUserEnvironment yes", "PasswordAuthentication no", "UsePAM no"):
        assert f"'{setting}'" in run, f"sshd drop-in lacks {setting}"
    assert re.search(r"'PidFile /(tmp|run)/", run)
    assert "sshd -t" in run, "validate the sshd configuration at build time"


# --------------------------------------------------------------------------------------------
# entrypoint.sh behaviour
# --------------------------------------------------------------------------------------------


def run_bash(script: str, *args: str, errexit: bool = False) -> subprocess.CompletedProcess[str]:
    flags = "-ec" if errexit else "-c"
    return subprocess.run(
        [bash(), flags, script, "bash", *args], capture_output=True, text=True, timeout=20, cwd=IMAGE_DIR
    )


SOURCE = f"source {shlex.quote(str(ENTRYPOINT))}"


def test_retry_while_false_fails_quickly() -> None:
    start = time.monotonic()
    proc = run_bash(f'{SOURCE}; retry_while "false" 2 0; echo "rc=$?"')
    assert proc.stdout.strip() == "rc=1"
    assert time.monotonic() - start < 5


def test_retry_while_true_succeeds() -> None:
    proc = run_bash(f'{SOURCE}; retry_while "true"; echo "rc=$?"')
    assert proc.stdout.strip() == "rc=0"
    assert proc.stderr == ""


def test_retry_while_counts_attempts_and_stops_on_success() -> None:
    proc = run_bash(f"{SOURCE}; n=0; retry_while '((++n >= 3))' 5 0; echo \"rc=$? n=$n\"")
    assert proc.stdout.strip() == "rc=0 n=3"
    proc = run_bash(f"{SOURCE}; n=0; retry_while '((++n)) && false' 4 0; echo \"rc=$? n=$n\"")
    assert proc.stdout.strip() == "rc=1 n=4"


def test_retry_while_defaults_are_generous() -> None:
    # sleep is replaced by a recording function, so the defaults show without waiting.
    script = (
        f'{SOURCE}; sleeps=(); sleep() {{ sleeps+=("$1"); }}; n=0; '
        "retry_while '((++n)) && false'; "
        'echo "rc=$? n=$n sleeps=${#sleeps[@]} each=${sleeps[0]}"'
    )
    proc = run_bash(script)
    assert proc.stdout.strip() == "rc=1 n=30 sleeps=29 each=10"


def test_retry_while_under_errexit_like_the_chart() -> None:
    # The chart's wait-for-workers container: bash -ec, a check_worker function, retry_while around it.
    script = (
        'check_worker() { [[ "$1" == up ]]; }\n'
        f'[[ -f "{ENTRYPOINT}" ]] && source "{ENTRYPOINT}"\n'
        'if retry_while "check_worker up" 3 0; then echo connected; fi\n'
        'if retry_while "check_worker down" 3 0; then echo wrong; else echo refused; fi\n'
    )
    proc = run_bash(script, errexit=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["connected", "refused"]


@pytest.mark.parametrize("bad", ["abc", "0", "-1"])
def test_retry_while_rejects_bad_retries(bad: str) -> None:
    proc = run_bash(f'{SOURCE}; retry_while "true" {bad} 0; echo "rc=$?"')
    assert proc.stdout.strip() == "rc=2"
    assert "retries must be a positive integer" in proc.stderr


def test_sourcing_is_quiet_and_does_not_exec() -> None:
    proc = run_bash(f"{SOURCE}; echo after-source")
    assert proc.returncode == 0
    assert proc.stdout == "after-source\n"
    assert proc.stderr == ""


def test_sourcing_ignores_the_callers_positional_arguments() -> None:
    # `source file` without arguments sees the caller's "$@"; it must not exec them.
    proc = run_bash(f"{SOURCE}; echo after-source", "echo", "EXECUTED")
    assert proc.stdout == "after-source\n"


def test_sourcing_keeps_shell_options() -> None:
    proc = run_bash(f'{SOURCE}; echo "$-"')
    assert "e" not in proc.stdout and "u" not in proc.stdout


def test_executed_with_arguments_execs_them() -> None:
    proc = subprocess.run(
        [bash(), str(ENTRYPOINT), "bash", "-c", 'echo "exec:$0:$$"'],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("exec:bash:")


def test_executed_without_arguments_does_nothing() -> None:
    proc = subprocess.run([bash(), str(ENTRYPOINT)], capture_output=True, text=True, timeout=20)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_scripts_are_executable(parsed: list[tuple[str, str]]) -> None:
    for path in (
        *(IMAGE_DIR / name for name in ("entrypoint.sh", "vertex_start.sh", "vertex_cluster.py")),
        SMOKE_TEST,
    ):
        assert path.read_text(encoding="utf-8").startswith("#!"), f"{path.name} needs a shebang"
        assert os.access(path, os.X_OK), f"{path.name} should be committed executable"
    # ... and the image does not depend on the checkout's file modes.
    assert re.search(rf"chmod 0755 {CHART_ENTRYPOINT}\s+/opt/deepspeed/vertex/vertex_start\.sh", runs(parsed))


# --------------------------------------------------------------------------------------------
# smoke_train.py's pure helpers, and its modules' (torch and deepspeed are imported inside functions)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    already = {name for name in ("torch", "deepspeed") if name in sys.modules}
    module = load_file(SMOKE_TEST, "deepspeed_smoke_test")  # with its modules (smoke_train_*.py)
    for name in ("torch", "deepspeed"):
        assert name in already or name not in sys.modules, f"smoke_train.py or a module of it imports {name} at the top"
    return module


# smoke_train.py's modules, as the script imported them; after `smoke`, whose check covers their top-level imports.
@pytest.fixture(scope="module")
def ranks(smoke: ModuleType) -> ModuleType:
    return importlib.import_module("recipes.smoke_train_ranks")


@pytest.fixture(scope="module")
def loop(smoke: ModuleType) -> ModuleType:
    return importlib.import_module("recipes.smoke_train_loop")


@pytest.fixture(scope="module")
def report(smoke: ModuleType) -> ModuleType:
    return importlib.import_module("recipes.smoke_train_report")


def test_parse_args_launcher_style(smoke: ModuleType) -> None:
    args = smoke.parse_args(["--local_rank=3", "--deepspeed_config", "ds_config.json"])
    assert args.local_rank == 3
    assert args.deepspeed_config == "ds_config.json"
    assert args.steps == 20
    assert args.expected_gpus_per_node is None
    args = smoke.parse_args(["--local-rank", "1", "--deepspeed-config=x.json", "--steps", "5"])
    assert (args.local_rank, args.deepspeed_config, args.steps) == (1, "x.json", 5)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--deepspeed_config", "x.json", "--steps", "0"],
        ["--deepspeed_config", "x.json", "--steps", "many"],
    ],
)
def test_parse_args_rejects_bad_input(smoke: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        smoke.parse_args(argv)
    assert exc.value.code == 2


def test_throughput(report: ModuleType) -> None:
    assert report.throughput(160, 2.0) == 80.0
    assert report.throughput(0, 1.0) == 0.0
    with pytest.raises(ValueError, match="positive"):
        report.throughput(10, 0.0)
    with pytest.raises(ValueError, match="negative"):
        report.throughput(-1, 1.0)


def test_local_world_size(ranks: ModuleType) -> None:
    assert ranks.local_world_size({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert ranks.local_world_size({"LOCAL_SIZE": "2"}) == 2  # the DeepSpeed launcher's name
    assert ranks.local_world_size({}) is None
    assert ranks.local_world_size({"LOCAL_SIZE": "x"}) is None


def test_gpu_visibility_ok(ranks: ModuleType) -> None:
    ok, message = ranks.check_gpu_visibility(4, 4, rank=2, host="w-1")
    assert ok
    assert message == "rank 2 on w-1: 4 GPU(s) visible, 4 rank(s) on this node"
    assert ranks.check_gpu_visibility(8, None, 8)[0]


def test_gpu_visibility_no_gpu(ranks: ModuleType) -> None:
    ok, message = ranks.check_gpu_visibility(0, 1, rank=0, host="w-0", visible_devices="0")
    assert not ok
    assert "no GPU visible" in message and "/usr/local/nvidia" in message and "'0'" in message


def test_gpu_visibility_too_few_for_the_ranks(ranks: ModuleType) -> None:
    ok, message = ranks.check_gpu_visibility(2, 4, rank=5, host="w-1")
    assert not ok
    assert message.startswith("rank 5 on w-1: 2 GPU(s) visible but 4 ranks on this node")


def test_gpu_visibility_expected_count(ranks: ModuleType) -> None:
    ok, message = ranks.check_gpu_visibility(4, 4, 8, rank=0, host="w-0")
    assert not ok
    assert "expected 8 per node" in message


def test_micro_batch_size(loop: ModuleType) -> None:
    assert loop.micro_batch_size({"train_micro_batch_size_per_gpu": 4}, 8) == 4
    assert loop.micro_batch_size({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 4) == 8
    assert loop.micro_batch_size({"train_batch_size": 2}, 8) == 1
    assert loop.micro_batch_size({}, 2) == loop.DEFAULT_MICRO_BATCH


def test_precision_and_optimizer(loop: ModuleType) -> None:
    assert loop.precision({"fp16": {"enabled": True}}) == "fp16"
    assert loop.precision({"bf16": {"enabled": True}}) == "bf16"
    assert loop.precision({"fp16": {"enabled": False}}) == "fp32"
    assert loop.needs_client_optimizer({})
    assert not loop.needs_client_optimizer({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})


def test_summarize(report: ModuleType) -> None:
    results = [
        report.RankResult(1, "w-0", 1, 2, 100.0, 512.0, 0.5),
        report.RankResult(0, "w-0", 0, 2, 110.0, 500.0, 0.5),
        report.RankResult(2, "w-1", 0, 2, 90.5, 640.25, 0.5),
    ]
    text = report.summarize(results)
    lines = text.splitlines()
    assert lines[1].split()[0] == "0", "ranks are listed in order"
    assert lines[-1] == "total: 3 rank(s) on 2 host(s), 300.5 samples/s, max peak memory 640.2 MiB"


def test_load_config(loop: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 2}', encoding="utf-8")
    assert loop.load_config(str(path)) == {"train_micro_batch_size_per_gpu": 2}
    path.write_text("[1]", encoding="utf-8")
    with pytest.raises(ValueError, match="JSON object"):
        loop.load_config(str(path))


def test_smoke_test_survives_the_charts_tpl() -> None:
    # source.configMap is rendered with Helm's tpl: a "{{" in a file it ships would be taken for a template.
    from recipes.contract import program_sources

    shipped = program_sources(SMOKE_TEST.name)
    assert {"smoke_train.py", "smoke_train_ranks.py", "smoke_train_report.py"} <= set(shipped)
    assert [name for name, text in shipped.items() if "{{" in text] == []


def test_smoke_test_passes_no_optimizer_when_the_generated_config_names_one(loop: ModuleType) -> None:
    # With optimizer offload the generated ds_config names DeepSpeed's optimizer; the script must not pass its own.
    from model.types import DeepSpeedConfig
    from workloads.ds_config import build_ds_config

    base = DeepSpeedConfig(zero_stage=3, offload_optimizer="cpu", offload_params="none", nvme_path="/local_nvme",
                           precision="bf16", micro_batch_per_gpu=1, gradient_accumulation=1,
                           reduce_bucket_size=1, allgather_bucket_size=1, steps_per_print=1, learning_rate=0.0003,
                           gradient_clipping=1.0)
    assert loop.needs_client_optimizer(build_ds_config(base, 2, 1)) is False
    no_offload = msgspec.structs.replace(base, offload_optimizer="none")
    assert loop.needs_client_optimizer(build_ds_config(no_offload, 2, 1)) is True


@pytest.mark.parametrize(("flag", "value", "word"), [("--steps", "0", "positive"), ("--steps", "x", "positive"),
                                                     ("--layers", "-1", "positive")])
def test_smoke_test_rejects_bad_counts(smoke: ModuleType, capsys: pytest.CaptureFixture[str], flag: str,
                                       value: str, word: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        smoke.parse_args([flag, value, "--deepspeed_config", "ds_config.json"])
    assert exit_info.value.code == 2
    assert f"expected a {word} integer, got {value!r}" in capsys.readouterr().err
