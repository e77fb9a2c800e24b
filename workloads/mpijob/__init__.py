"""The Kubeflow `kubeflow.org/v2beta1` MPIJob of a workload, rendered as a plain dict.

A pure function of the typed config, so tests validate it against the operator's CRD schema and the operator's own
admission rules without running Pulumi. Its modules:

- shape.py: what every MPIJob shares (names, the ConfigMap and claim, environment, the job's spec, the operator's
  own rules), and pod_templates.py: the launcher's and workers' pod templates every path builds on;
- nvidia.py: the stack's image on a GKE pool, `deepspeed --hostfile` over the operator's hostfile; its
  `NvidiaLaunch` + `render_spec(inputs, launch)` is the entry point for a kind built on the NVIDIA MPIJob;
- gaudi.py: the Omnia reference on Gaudi nodes (the stack's Gaudi image, or the install-at-start opt-in), with
  gaudi_env.py (its environment), gaudi_launcher.py (its commands), gaudi_folders.py (the ranks' folders on the
  claim) and gaudi_flags.py (the `training.args` the launcher sets).

Below: the workload's path by its accelerator (`path_of`, the one place it is picked), for the TrainingJob
component and the tests.
"""

from __future__ import annotations

from typing import Any, Protocol

from model.types import MpiJobBaseConfig, MpiJobWorkloadConfig
from workloads.mpijob import gaudi, gaudi_env, nvidia
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


class Strategy(Protocol):
    """A workload's MPIJob path on its accelerator: what differs between NVIDIA and Gaudi, for one workload."""

    def image(self, stack_image: str | None, gaudi_built: str | None) -> str: ...
    def plain_env(self, where: Placement) -> dict[str, str]: ...
    def forwarded_env(self, where: Placement, has_token: bool) -> list[str]: ...
    def config_map_data(self, where: Placement, has_token: bool, launch: NvidiaLaunch | None) -> dict[str, str]: ...
    def render_spec(self, inputs: MpiJobInputs, launch: NvidiaLaunch | None) -> dict[str, Any]: ...


class _Nvidia:
    """The stack's image on a GKE pool, `deepspeed --hostfile` (nvidia.py); a kind may bring its own launch."""

    def __init__(self, w: MpiJobBaseConfig) -> None:
        self.w = w

    def image(self, stack_image: str | None, gaudi_built: str | None) -> str:
        return nvidia.image(self.w, stack_image)

    def plain_env(self, where: Placement) -> dict[str, str]:
        return nvidia.plain_env(self.w, where)

    def forwarded_env(self, where: Placement, has_token: bool) -> list[str]:
        return nvidia.forwarded_env(self.w, where, has_token)

    def config_map_data(self, where: Placement, has_token: bool, launch: NvidiaLaunch | None) -> dict[str, str]:
        return nvidia.config_map_data(self.w, where, has_token, launch)

    def render_spec(self, inputs: MpiJobInputs, launch: NvidiaLaunch | None) -> dict[str, Any]:
        return nvidia.render_spec(inputs, launch)


class _Gaudi:
    """The Omnia reference on Gaudi nodes (gaudi.py): the stack's Gaudi image; no kind brings its own launch."""

    def __init__(self, w: MpiJobWorkloadConfig) -> None:
        self.w = w

    def image(self, stack_image: str | None, gaudi_built: str | None) -> str:
        return gaudi.image(self.w, gaudi_built)

    def plain_env(self, where: Placement) -> dict[str, str]:
        return gaudi_env.plain_env(self.w, where)

    def forwarded_env(self, where: Placement, has_token: bool) -> list[str]:
        return gaudi_env.forwarded_env(self.w, where, has_token)

    def config_map_data(self, where: Placement, has_token: bool, launch: NvidiaLaunch | None) -> dict[str, str]:
        return gaudi.config_map_data(self.w, where, has_token)

    def render_spec(self, inputs: MpiJobInputs, launch: NvidiaLaunch | None) -> dict[str, Any]:
        return gaudi.render_spec(inputs)


def path_of(w: MpiJobBaseConfig) -> Strategy:
    """The one place the accelerator picks the path: Gaudi for a kind-mpijob workload on Gaudi (only kind mpijob
    has the Gaudi keys), NVIDIA otherwise."""
    return _Gaudi(w) if isinstance(w, MpiJobWorkloadConfig) and w.on_gaudi else _Nvidia(w)


def launcher_image(w: MpiJobBaseConfig, stack_image: str | None, gaudi_built: str | None = None) -> str:
    """`image` overrides; else the stack's Gaudi image (or Habana's with the install-at-start opt-in) for
    gaudi, the stack's built image for nvidia."""
    return path_of(w).image(stack_image, gaudi_built)


def plain_env(w: MpiJobBaseConfig, where: Placement) -> dict[str, str]:
    """Non-secret variables of the launcher and workers."""
    return path_of(w).plain_env(where)


def forwarded_env(w: MpiJobBaseConfig, where: Placement, has_token: bool) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers."""
    return path_of(w).forwarded_env(where, has_token)


def config_map_data(w: MpiJobBaseConfig, where: Placement, has_token: bool,
                    launch: NvidiaLaunch | None = None) -> dict[str, str]:
    """The job's ConfigMap (mounted at CONFIG_DIR on the launcher and every worker)."""
    return path_of(w).config_map_data(where, has_token, launch)


def render_spec(inputs: MpiJobInputs, launch: NvidiaLaunch | None = None) -> dict[str, Any]:
    """The job's spec on its accelerator's path; `launch`: a kind's own launch on the NVIDIA path."""
    return path_of(inputs.workload).render_spec(inputs, launch)


def render(inputs: MpiJobInputs, namespace: str, labels: dict[str, str] | None = None,
           launch: NvidiaLaunch | None = None) -> dict[str, Any]:
    """The whole MPIJob object (apiVersion, kind, metadata, spec)."""
    return render_job(inputs, render_spec(inputs, launch), namespace, labels)


__all__ = [
    "API_VERSION", "CONFIG_DIR", "DNS1035_LABEL", "DNS_LABEL_MAX", "DS_CONFIG_KEY", "HF_TOKEN_KEY", "KIND",
    "NVIDIA_SSH_PORT", "SSH_CLIENT_KEY", "MpiJobInputs", "NvidiaLaunch", "Strategy", "config_map_data",
    "config_map_name", "forwarded_env", "launcher_image", "nvidia_launcher_script", "nvidia_worker_script",
    "operator_problems", "path_of", "plain_env", "pod_labels", "render", "render_spec", "reserved_flag",
    "token_secret_name", "worker_pod_name",
]
