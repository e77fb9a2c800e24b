"""docs/workloads.md's "Deviations from the Omnia example" says what the stack renders instead of Omnia's job (issue
39 item 5): each row of that table is held to the gaudi stack's rendered MPIJob, claim and ConfigMap, so a row that
drifts from what is rendered (or a row added without a check here) fails."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import PROJECT_DIR, stack_run

from preview.engine import RunResult

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
JOB = "gaudi-llm-ds-ft"


def deviations() -> dict[str, str]:
    """The table's rows: Omnia's cell -> the stack's cell."""
    text = (PROJECT_DIR / "docs" / "workloads.md").read_text(encoding="utf-8")
    table = text.split("**Deviations from the Omnia example.**", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| Omnia", "| ---"))]
    return {cells[0]: cells[1] for cells in ([c.strip() for c in row.strip("|").split(" | ")] for row in rows)}


@pytest.fixture(scope="module")
def gaudi() -> RunResult:
    return stack_run("gaudi")


def spec(run: RunResult) -> dict[str, Any]:
    return run.one(MPIJOB).inputs["spec"]


def pod(run: RunResult, role: str) -> dict[str, Any]:
    return spec(run)["mpiReplicaSpecs"][role]["template"]["spec"]


def script(run: RunResult, role: str = "Launcher") -> str:
    return pod(run, role)["containers"][0]["args"][0]


def files(run: RunResult) -> dict[str, str]:
    return run.one(CONFIG_MAP, f"{JOB}-config").inputs["data"]


def _deepspeed(run: RunResult) -> bool:
    ds = json.loads(files(run)["ds_config.json"])
    return (" --deepspeed /etc/deepspeed/ds_config.json " in script(run) and ds["zero_optimization"]["stage"] == 2
            and ds["bf16"]["enabled"] is True and ds["gradient_clipping"] == 0.3)


def _hardened(run: RunResult) -> bool:
    pods = [pod(run, role) for role in ("Launcher", "Worker")]
    users = {p["securityContext"]["runAsUser"] for p in pods}
    policies = [r for r in run.by_type(POLICY) if r.inputs["metadata"]["name"].startswith(JOB)]
    return (users == {10001} and all(p.get("automountServiceAccountToken") is False for p in pods)
            and len(policies) == 2
            and pod(run, "Worker")["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == 2222)


def _token(run: RunResult) -> bool:
    envs = [e for role in ("Launcher", "Worker") for e in pod(run, role)["containers"][0]["env"]]
    return not [e for e in envs if e["name"] in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and "value" in e]


def _resources(run: RunResult) -> bool:
    launcher = pod(run, "Launcher")["containers"][0]["resources"]
    worker = pod(run, "Worker")["containers"][0]["resources"]
    return launcher["limits"] == {"cpu": "2", "memory": "8Gi"} and worker["limits"]["cpu"] == "64"


def _final(run: RunResult) -> bool:
    launcher = spec(run)["mpiReplicaSpecs"]["Launcher"]
    return (spec(run)["runPolicy"]["backoffLimit"] == 6 and launcher["restartPolicy"] == "OnFailure"
            and {"name": "launcher-state", "emptyDir": {"sizeLimit": "1Mi"}} in pod(run, "Launcher")["volumes"]
            and script(run).splitlines()[1].startswith("if [ -f /run/deepspeed-stack/final-status ]; then "))


# Omnia's cell -> (the stack's cell, as the table must say it; what the rendered job must show).
ROWS: dict[str, tuple[str, Callable[[RunResult], bool]]] = {
    "no `--deepspeed` (DeepSpeed's defaults)": (
        "`--deepspeed /etc/deepspeed/ds_config.json` (ZeRO-2, bf16, clipping 0.3)", _deepspeed),
    "`--output_dir ./model_lora_llama_ddp`": (
        "`<storage.mountPath>/deepspeed-stack/output/<name>`",
        lambda run: f" --output_dir /storage/deepspeed-stack/output/{JOB} " in script(run)),
    "`--world_size $N_CARDS` (lines of the hostfile x `NUM_HPU`)": (
        "`workers x accelerator.count`, written out",
        lambda run: " --world_size 8 " in script(run) and spec(run)["slotsPerWorker"] == 8),
    "image `pytorch-installer-2.5.1:latest`; optimum-habana cloned and DeepSpeed pip-installed on every node at every "
    "start": (
        "the stack's Gaudi image by digest, everything installed at build time",
        lambda run: "@sha256:" in pod(run, "Launcher")["containers"][0]["image"]
        and not re.search(r"git clone|pip install", script(run))),
    "root, no security context, service-account token mounted, no NetworkPolicy; sshd on Habana's default port": (
        "user 10001, hardened pods, two NetworkPolicies; sshd on 2222", _hardened),
    "`HUGGING_FACE_HUB_TOKEN` as a plain value": (
        "`HF_TOKEN`/`HUGGING_FACE_HUB_TOKEN` from a Secret mounted as a file", _token),
    "token and proxies `sed`-patched into `run_lora_clm.py`; `sed` by line number for `--force_multi`": (
        "`SendEnv`/`AcceptEnv` over ssh; `--force_multi` matched by text and verified",
        lambda run: "SendEnv " in files(run)["ssh_client.conf"] and "AcceptEnv=" in script(run, "Worker")
        and "sed -i" not in script(run)),
    "PVC `ReadWriteOnce`": (
        "`ReadWriteMany` (the gaudi stack's); `ReadWriteOnce` accepted on an NFS class such as `nfs-client`",
        lambda run: run.one(CLAIM).inputs["spec"]["accessModes"] == ["ReadWriteMany"]),
    "no CPU request; no launcher resources": ("`resources.cpu`; launcher 2 CPU / 8Gi", _resources),
    "`mpirun` to install on the workers; `--allow-run-as-root`": (
        "none (pdsh over ssh only)",
        lambda run: "mpirun" not in script(run) and "--allow-run-as-root" not in script(run)),
    "`backoffLimit: 6`, `restartPolicy: OnFailure`: a bad argument retried six times": (
        "exit 2 remembered in the launcher's `launcher-state` emptyDir: every later attempt stops at once", _final),
}


def test_every_row_is_checked() -> None:
    assert sorted(deviations()) == sorted(ROWS)


@pytest.mark.parametrize("omnia", sorted(ROWS))
def test_the_row_says_what_is_rendered(gaudi: RunResult, omnia: str) -> None:
    said, rendered = ROWS[omnia]
    assert deviations()[omnia] == said
    assert rendered(gaudi), omnia
