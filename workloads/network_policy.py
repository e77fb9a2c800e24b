"""The NetworkPolicy of an MPIJob: who may reach the launcher and the workers.

- workers accept the launcher on SSH only (DeepSpeed's pdsh starts the ranks over it; the readiness probe
  comes from the node's kubelet) and each other on any port: the collective's rendezvous (MASTER_PORT on the
  first worker) and its process group connections use ports chosen at run time;
- the launcher accepts nothing: it only connects out (ssh to the workers, Hugging Face, the API server's
  host in no_proxy). With the install-at-start opt-in, mpirun's daemons on the workers call the launcher
  back, so there it accepts the workers, and the workers accept the launcher on any port.

Egress stays open: the job downloads models and datasets from Hugging Face (or a proxy). Pods are selected by
the labels the MPIJob's pod templates carry (`deepspeed-stack/workload`, `deepspeed-stack/role`), which the
operator copies onto the pods, so the policy does not depend on the operator version's own labels.
"""

from __future__ import annotations

from typing import Any

from model.types import MpiJobBaseConfig, MpiJobWorkloadConfig
from workloads import mpijob
from workloads.pod_security import GAUDI_SSH_PORT


def names(w: MpiJobBaseConfig) -> dict[str, str]:
    """The two policies' names, by the role whose pods each isolates."""
    return {role: f"{w.name}-{role}" for role in ("launcher", "worker")}


def _from(w: MpiJobBaseConfig, role: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": mpijob.pod_labels(w, role)}}


def specs(w: MpiJobBaseConfig) -> dict[str, dict[str, Any]]:
    """NetworkPolicy specs by role: the launcher's and the workers'."""
    opt_in = isinstance(w, MpiJobWorkloadConfig) and w.installs_at_start
    from_launcher: dict[str, Any] = {"from": [_from(w, "launcher")]}
    if not opt_in:
        port = GAUDI_SSH_PORT if w.on_gaudi else mpijob.NVIDIA_SSH_PORT  # each image's sshd
        from_launcher["ports"] = [{"protocol": "TCP", "port": port}]
    worker = {"podSelector": {"matchLabels": mpijob.pod_labels(w, "worker")}, "policyTypes": ["Ingress"],
              "ingress": [from_launcher, {"from": [_from(w, "worker")]}]}
    launcher = {"podSelector": {"matchLabels": mpijob.pod_labels(w, "launcher")}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [_from(w, "worker")]}] if opt_in else []}
    return {"launcher": launcher, "worker": worker}
