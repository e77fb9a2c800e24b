"""The Kubeflow `kubeflow.org/v2beta1` MPIJob of a workload, rendered as a plain dict.

A pure function of the typed config, so tests validate it against the operator's CRD schema and the operator's own
admission rules without running Pulumi. Three modules:

- shape.py: what every MPIJob shares (names, the ConfigMap and claim, environment, pod templates, the job's spec,
  the operator's own rules);
- nvidia.py: the stack's image on a GKE pool, `deepspeed --hostfile` over the operator's hostfile; its
  `NvidiaLaunch` + `render_spec(inputs, launch)` is the entry point for a kind built on the NVIDIA MPIJob;
- gaudi.py: the Omnia reference on Gaudi nodes (the stack's Gaudi image, or the install-at-start opt-in).

Below: the workload's path by its accelerator, for the TrainingJob component and the tests.
"""

from __future__ import annotations

from typing import Any

from model.types import MpiJobBaseConfig, MpiJobWorkloadConfig
from workloads.mpijob import gaudi, nvidia
from workloads.mpijob.gaudi import reserved_flag
from workloads.mpijob.nvidia import NVIDIA_SSH_PORT, NvidiaLaunch, nvidia_launcher_script, nvidia_worker_script
from workloads.mpijob.shape import (
    API_VERSION,
    CONFIG_DIR,
    DNS1035_LABEL,
    DNS_LABEL_MAX,
    DS_CONFIG_KEY,
    HF_TOKEN_KEY,
    KIND,
    SSH_CLIENT_KEY,
    MpiJobInputs,
    config_map_name,
    operator_problems,
    pod_labels,
    token_secret_name,
    worker_pod_name,
)
from workloads.mpijob.shape import render as render_job
from workloads.placement import Placement


def _gaudi(w: MpiJobBaseConfig) -> MpiJobWorkloadConfig | None:
    """The workload when it runs on Gaudi (only kind mpijob has the Gaudi keys); None on NVIDIA."""
    return w if isinstance(w, MpiJobWorkloadConfig) and w.on_gaudi else None


def launcher_image(w: MpiJobBaseConfig, stack_image: str | None, gaudi_built: str | None = None) -> str:
    """`image` overrides; else the stack's Gaudi image (or Habana's with the install-at-start opt-in) for
    gaudi, the stack's built image for nvidia."""
    g = _gaudi(w)
    return gaudi.image(g, gaudi_built) if g is not None else nvidia.image(w, stack_image)


def plain_env(w: MpiJobBaseConfig, where: Placement) -> dict[str, str]:
    """Non-secret variables of the launcher and workers."""
    g = _gaudi(w)
    return gaudi.plain_env(g, where) if g is not None else nvidia.plain_env(w, where)


def forwarded_env(w: MpiJobBaseConfig, where: Placement, has_token: bool) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers."""
    g = _gaudi(w)
    return gaudi.forwarded_env(g, where, has_token) if g is not None else nvidia.forwarded_env(w, where, has_token)


def config_map_data(w: MpiJobBaseConfig, where: Placement, has_token: bool,
                    launch: NvidiaLaunch | None = None) -> dict[str, str]:
    """The job's ConfigMap (mounted at CONFIG_DIR on the launcher and every worker)."""
    g = _gaudi(w)
    return gaudi.config_map_data(g, where, has_token) if g is not None else \
        nvidia.config_map_data(w, where, has_token, launch)


def render_spec(inputs: MpiJobInputs, launch: NvidiaLaunch | None = None) -> dict[str, Any]:
    """The job's spec on its accelerator's path; `launch`: a kind's own launch on the NVIDIA path."""
    if _gaudi(inputs.workload) is not None:
        return gaudi.render_spec(inputs)
    return nvidia.render_spec(inputs, launch)


def render(inputs: MpiJobInputs, namespace: str, labels: dict[str, str] | None = None,
           launch: NvidiaLaunch | None = None) -> dict[str, Any]:
    """The whole MPIJob object (apiVersion, kind, metadata, spec)."""
    return render_job(inputs, render_spec(inputs, launch), namespace, labels)


__all__ = [
    "API_VERSION", "CONFIG_DIR", "DNS1035_LABEL", "DNS_LABEL_MAX", "DS_CONFIG_KEY", "HF_TOKEN_KEY", "KIND",
    "NVIDIA_SSH_PORT", "SSH_CLIENT_KEY", "MpiJobInputs", "NvidiaLaunch", "config_map_data", "config_map_name",
    "forwarded_env", "launcher_image", "nvidia_launcher_script", "nvidia_worker_script", "operator_problems",
    "plain_env", "pod_labels", "render", "render_spec", "reserved_flag", "token_secret_name", "worker_pod_name",
]
