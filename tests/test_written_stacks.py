"""Every stack `make gpus WRITE=` writes passes the checks every stack file must pass (issue 40 item 2).

A user who writes a plan (`make gpus ... WRITE=big`) and then runs `make test` has that file among the stack files
the every-stack checks run over (conftest.stacks()): a plan the writer accepted must not turn the suite red. Here
the writer runs in-process over a grid (the three modes; on-demand, a reservation with its DWS fallback, spot; with
and without the server of the result; each GPU family of the catalog), each file is written to a test folder, and
every check that runs over each stack file (EVERY_STACK below: schema and rules, policy pack with and without a
token, first-up order, pod fit, pod hardening, manifests, the offline preview) runs on it.

Each file is taken as its header tells the user to take it: the token set when the model is gated (step
`pulumi config set --secret hfToken`). Spot and DWS pools the writer does not write itself (it plans on-demand, a
reservation's fallback aside): those rows are a written plan with the keys docs/reference.md gives them set on the
trainer's pool, as a user who wants the cheaper capacity edits it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PROJECT_DIR, set_path, stack_run
from test_config import stack_is_valid
from test_first_up_order import custom_resources_wait
from test_hf_token import passes_with_a_token
from test_node_memory import NODE_POOL, gpu_pods, gpu_pods_that_fit, node_labels, selects
from test_pod_hardening import (
    jobs_of,
    launchers_and_workers_are_hardened,
    waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon,
    what_the_scripts_write_is_writable,
)
from test_policy import no_mandatory_violation
from test_user_path import valid_manifests

from model import catalog, reservation
from preview import __main__ as preview_cli
from preview import write_stack

NOW = "2026-11-27T12:00:00Z"
END = "2026-12-04T00:00Z"  # a reservation's end, 6.5 days after NOW
# name: (make gpus variables, keys the user then sets as `pulumi config set --path` names them)
GRID: dict[str, tuple[str, dict[str, Any]]] = {
    # The stack: 70B LoRA on a held A3 Mega reservation (DWS fallback), served on 8 x L4.
    "big": (f"MODEL=meta-llama/Llama-3.1-70B-Instruct MODE=finetune RESERVATION=llm-res:4xa3-megagpu-8g:{END} "
            "SERVE=1", {}),
    "h100-reserved": (f"MODEL=Qwen2.5-7B MODE=training RESERVATION=h100-res:2xa3-highgpu-8g:{END} TOKENS=1e9 "
                      "SERVE=0", {}),
    "cheapest": ("MODEL=Qwen/Qwen2.5-7B-Instruct MODE=finetune", {}),
    "a100-spot": ("MODEL=Qwen2.5-7B MODE=finetune GPUS=nvidia-a100-80gb SERVE=1", {"nodePools[0].spot": True}),
    "h200-dws": ("MODEL=Qwen2.5-72B MODE=finetune GPUS=H200 SERVE=0", {
        "nodePools[0].flexStart": True, "nodePools[0].queuedProvisioning": True, "kueue.install": True,
        "cluster.minMasterVersion": "1.33"}),
    "t4-serve": ("MODEL=opt-1.3b MODE=inference GPUS=T4 PRECISION=fp16", {}),
    "b200-serve": ("MODEL=Llama-3.1-70B MODE=inference GPUS=B200", {}),
    # No node of 8 x H100 Mega holds Llama-3.1-405B in bf16: one replica across 2 (a LeaderWorkerSet group).
    "405b-h100-mega": ("MODEL=meta-llama/Llama-3.1-405B-Instruct MODE=inference GPUS=H100-MEGA", {}),
}
FLAGS = {"MODEL": "--model", "MODE": "--mode", "GPUS": "--gpus", "PRECISION": "--precision", "SERVE": "--serve",
         "RESERVATION": "--reservation", "TOKENS": "--tokens"}
TOKEN = "  deepspeed-stack:hfToken:\n    secure: v1:planted\n"  # what `pulumi config set --secret` writes
# Every test the suite runs over each stack file (parametrized by conftest.stacks()), and what runs it here.
EVERY_STACK = {
    "test_config.test_repo_stacks_are_valid": "stack_is_valid",
    "test_hf_token.test_every_stack_passes_the_policy_pack_with_a_token": "passes_with_a_token",
    "test_policy.test_repo_stacks_have_no_mandatory_violation": "no_mandatory_violation",
    "test_first_up_order.test_every_custom_resource_waits_for_what_admits_it": "custom_resources_wait",
    "test_node_memory.test_every_gpu_pod_fits_its_node": "gpu_pods_that_fit",
    "test_pod_hardening.nvidia_jobs": "launchers_and_workers_are_hardened, what_the_scripts_write_is_writable, "
                                      "waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon",
    "test_user_path.test_every_manifest_file_is_a_valid_kubernetes_object": "valid_manifests",
}


@pytest.fixture(autouse=True)
def fixed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reservation.NOW_ENV, NOW)


def write(name: str, tmp_path: Path) -> Path:
    """`make gpus <variables> WRITE=<name>`, in-process, into tmp_path; then the user's steps the header names."""
    spec, edits = GRID[name]
    tmp_path.mkdir(parents=True, exist_ok=True)
    argv = [arg for pair in spec.split() for arg in (FLAGS[pair.split("=")[0]], pair.split("=", 1)[1])]
    assert write_stack.main([*argv, "--stack", name, "--dir", str(tmp_path)]) == 0, spec
    path = tmp_path / f"Pulumi.{name}.yaml"
    text = path.read_text(encoding="utf-8")
    if "is gated on Hugging Face" in text:
        text += TOKEN  # Next: `pulumi config set --secret hfToken hf_...`
    if edits:
        doc = yaml.safe_load(text)
        for key, value in edits.items():
            set_path(doc["config"], key, value)
        text = yaml.safe_dump(doc, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", list(GRID))
def test_every_written_stack_passes_every_stack_check(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write(name, tmp_path / "project")
    run = stack_run(name, example=False, path=path)
    stack_is_valid(name, path)
    if "deepspeed-stack:hfToken" not in path.read_text(encoding="utf-8"):
        passes_with_a_token(name, path)  # else the runs below have one
    no_mandatory_violation(run)
    custom_resources_wait(run)
    assert gpu_pods_that_fit(name, example=False, path=path)
    jobs = jobs_of(name, run)
    launchers_and_workers_are_hardened(jobs)
    what_the_scripts_write_is_writable(jobs)
    waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon(jobs)
    assert valid_manifests(run)
    # `make preview` on the file, all of it but the program's run, which is the one above (a second run of the
    # same config under the same mocks: the same registrations, 0.3-0.5 s a stack).
    monkeypatch.setattr(preview_cli, "run", lambda stack, file: run if (stack, file) == (name, path) else None)
    assert preview_cli.main(["--stack", name, "--stack-file", str(path), "--out", str(tmp_path / "build")]) == 0
    assert "error" not in capsys.readouterr().err


def test_each_pod_is_measured_against_its_own_pools_nodes(tmp_path: Path) -> None:
    """The issue's failure: big's A3 Mega trainer was held to the 8 x L4 server pool's 361.6 GiB (the smallest pool
    with 8 GPUs). Each pod is matched to the pools its selector and affinity allow, as the scheduler matches them."""
    run = stack_run("big", example=False, path=write("big", tmp_path))
    pools = {labels["deepspeed-stack/pool"]: labels for labels in
             (node_labels(r) for r in run.by_type(NODE_POOL) if r.inputs["nodeConfig"].get("guestAccelerators"))}
    matched = {reg.name: sorted(name for name, labels in pools.items() if selects(pod, labels))
               for reg in run.resources for pod, _ in gpu_pods(reg.inputs)}
    assert matched == {"train-mpijob": ["h100-mega-80gb", "h100-mega-80gb-dws"], "serve-deployment": ["l4-serve"]}


def test_the_grid_covers_the_modes_capacity_servers_and_every_gpu_family(tmp_path: Path) -> None:
    """Read from the written files, not from the grid's variables: what the writer wrote is what is covered."""
    cat = catalog.load()
    families, capacity, kinds = set(), set(), set()
    for name in GRID:
        config = yaml.safe_load(write(name, tmp_path / name).read_text(encoding="utf-8"))["config"]
        for pool in config["deepspeed-stack:nodePools"]:
            families.add(cat.gpus[pool["gpu"]["type"]].family)
            capacity.add("reservation" if pool.get("reservation") else "dws" if pool.get("queuedProvisioning")
                         else "spot" if pool.get("spot") else "on-demand")
        workloads = config["deepspeed-stack:workloads"].values()
        kinds.add(tuple(sorted(w.get("kind", "mpijob") for w in workloads)))
    assert families == {gpu.family for gpu in cat.gpus.values()}
    assert capacity == {"reservation", "dws", "spot", "on-demand"}
    # Training alone, training with its server (SERVE=1), a server alone (inference).
    assert {("finetune",), ("finetune", "serve"), ("serve",)} <= kinds
    assert {GRID[n][0].split("MODE=")[1].split()[0] for n in GRID} == {"training", "finetune", "inference"}


def _every_stack_tests() -> set[str]:
    """module.function of each test (or helper) that runs over conftest.stacks(), read from the test files."""
    found = set()
    for path in sorted((PROJECT_DIR / "tests").glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if "stacks()" not in text:
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(call, ast.Call) and getattr(call.func, "id", None) == "stacks"
                    for call in ast.walk(node)):
                found.add(f"{path.stem}.{node.name}")
    return found


def test_the_grid_runs_every_check_that_runs_over_each_stack_file() -> None:
    """A new check over conftest.stacks() must be added here too (EVERY_STACK, and the test above)."""
    assert _every_stack_tests() == set(EVERY_STACK)
    called = {n.func.id for n in ast.walk(ast.parse(Path(__file__).read_text(encoding="utf-8")))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    for names in EVERY_STACK.values():
        assert {n.strip() for n in names.split(",")} <= called, names



def test_workers_collect_the_stack_files_the_controller_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack file written while `make test` collects (`make gpus WRITE=` in another terminal) made the two xdist
    workers collect different tests ("Different tests were collected between gw0 and gw1"): the controller lists
    the files once and each worker takes that list."""
    import conftest

    node = type("Node", (), {"workerinput": {}})()
    conftest.pytest_configure_node(node)
    assert node.workerinput[conftest.STACKS_KEY] == conftest.stacks()
    monkeypatch.setattr(conftest, "_LISTED_STACKS", None)
    worker = type("Config", (), {"workerinput": {conftest.STACKS_KEY: ["dev", "written-meanwhile"]}})()
    conftest.pytest_configure(worker)
    assert conftest.stacks() == ["dev", "written-meanwhile"]  # the controller's list, not the folder's files now
