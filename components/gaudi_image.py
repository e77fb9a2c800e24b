"""The Gaudi image of a stack: workloads/images/gaudi on the pinned Habana base, for its Gaudi MPIJobs.

Pure helpers: which workloads run it, its Dockerfile ARGs, and where it is pushed. The build itself is the
ContainerImage component, as for the NVIDIA image.
"""

from __future__ import annotations

from model import gaudi_software
from model.types import MpiJobWorkloadConfig, StackConfig

DOCKER_HUB = "docker.io"


def workloads_on_it(cfg: StackConfig) -> list[MpiJobWorkloadConfig]:
    """Gaudi MPIJobs that run the stack's Gaudi image: neither an `image` of their own nor the install-at-start
    opt-in."""
    return [w for w in cfg.workloads.values()
            if isinstance(w, MpiJobWorkloadConfig) and w.runs_stack_gaudi_image and not w.image]


def build_args(w: MpiJobWorkloadConfig) -> dict[str, str]:
    """The Dockerfile's ARGs for a workload's Gaudi software: base image (tag and digest), optimum-habana and
    HabanaAI DeepSpeed tags. None of them is left to the Dockerfile's defaults."""
    base = gaudi_software.base_image(w.gaudi)
    if base is None:
        raise ValueError(f"workload {w.name}: no base image recorded for its Gaudi software (a check says so)")
    return {"BASE_IMAGE": base.ref, "OPTIMUM_HABANA_VERSION": w.training.optimum_habana_version,
            "HABANA_DEEPSPEED_VERSION": gaudi_software.habana_deepspeed_ref(w.gaudi.software_version)}


def registry_host(reference: str) -> str:
    """The registry host of a repository or image reference, as docker keys its credentials."""
    first, sep, _ = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def uses_artifact_registry(cfg: StackConfig) -> bool:
    """With Google Cloud settings the image goes to the stack's Artifact Registry, else to gaudiImage.registry."""
    return bool(cfg.project)
