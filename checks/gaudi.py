"""Pre-deploy checks of the Gaudi image and its registry, and the Gaudi warnings, one function per rule."""

from __future__ import annotations

from checks.common import Check, at
from components import gaudi_image
from model import gaudi_software
from model.types import StackConfig, WorkloadConfig


def versions(w: WorkloadConfig) -> tuple[str, str, str, str]:
    """What goes into the Gaudi image: software, OS, PyTorch and optimum-habana versions."""
    g = w.gaudi
    return g.software_version, g.os, g.pytorch_version, w.training.optimum_habana_version


def check_gaudi_base_image(m: StackConfig) -> list[str]:
    """The stack builds only on a base image pinned in data/gaudi_software.yaml."""
    if m.gaudi_image.prebuilt:
        return []
    known = ", ".join(f"{b.software_version}/{b.os}/pytorch {b.pytorch}" for b in gaudi_software.base_images())
    return [f"{at('workloads', w.name, 'gaudi', 'softwareVersion')}: no pinned Habana base image for "
            f"{w.gaudi.software_version}/{w.gaudi.os}/pytorch {w.gaudi.pytorch_version} in data/gaudi_software.yaml "
            f"(known: {known}); record it there, set gaudiImage.prebuilt, or set workloads.{w.name}.image"
            for w in gaudi_image.workloads_on_it(m) if gaudi_software.base_image(w.gaudi) is None]


def check_one_gaudi_build(m: StackConfig) -> list[str]:
    """One Gaudi image per stack: the workloads that run it agree on what goes into it."""
    jobs = gaudi_image.workloads_on_it(m)
    if m.gaudi_image.prebuilt or len(jobs) < 2:
        return []
    first = jobs[0]
    return [f"{at('workloads', w.name, 'gaudi')}: the stack builds one Gaudi image, from workloads.{first.name}'s "
            f"versions {'/'.join(versions(first))}; this workload asks for {'/'.join(versions(w))}. Use the same "
            "gaudi versions and training.optimumHabanaVersion, or give it an `image` of its own"
            for w in jobs[1:] if versions(w) != versions(first)]


def check_gaudi_registry(m: StackConfig) -> list[str]:
    """Without Google Cloud settings the image needs a registry the cluster can reach."""
    jobs = gaudi_image.workloads_on_it(m)
    if not jobs or m.gaudi_image.prebuilt or gaudi_image.uses_artifact_registry(m) or m.gaudi_image.registry:
        return []
    return [f"gaudiImage.registry: required: the stack has no gcp:project, so the Gaudi image of "
            f"workloads.{jobs[0].name} is pushed to a registry the cluster can pull from; set gaudiImage.registry "
            "(e.g. registry.example.com/ml, with gaudiImage.username and the secret registryPassword if it needs a "
            "login), or gaudiImage.prebuilt, or workloads.<name>.image"]


def check_registry_login(m: StackConfig) -> list[str]:
    """The registry login is a pair: a user and its secret password."""
    if m.gaudi_image.username and m.registry_password is None:
        return ["registryPassword: required with gaudiImage.username; set it with "
                "`pulumi config set --secret registryPassword <password or token>`"]
    if m.registry_password is not None and not m.gaudi_image.username:
        return ["gaudiImage.username: required with registryPassword (the registry user it belongs to)"]
    return []


CHECKS: list[Check] = [
    check_gaudi_base_image,
    check_one_gaudi_build,
    check_gaudi_registry,
    check_registry_login,
]


def warnings(m: StackConfig) -> list[str]:
    """What deploys but must be confirmed: an unpinned base digest (the install-at-start opt-in: its kind's
    warning, workloads/kinds/mpijob.py)."""
    out = []
    if not m.gaudi_image.prebuilt:
        for w in gaudi_image.workloads_on_it(m)[:1]:
            base = gaudi_software.base_image(w.gaudi)
            if base is not None and base.digest is None:
                out.append(f"{at('workloads', w.name, 'gaudi', 'softwareVersion')}: the Habana base image "
                           f"{base.repository}:{base.tag} is pinned by tag only (digest unconfirmed); record its "
                           "digest in data/gaudi_software.yaml (`docker buildx imagetools inspect`)")
    return out
