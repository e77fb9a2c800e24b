"""The workload policies: no credential as a literal env value, accelerator containers with CPU and memory,
images and Helm charts pinned (in pod specs, MPIJobs and Helm values)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs

from policy.rules_support import UNKNOWN, get, is_dev, is_kubernetes, props_of, walk

HELM_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart", "kubernetes:helm.sh/v3:Chart")
ACCELERATORS = ("nvidia.com/gpu", "habana.ai/gaudi")
SECRET = "[secret]"
# Env var names that carry credentials: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, DB_PASSWORD, API_KEY, AWS_SECRET_...
SECRET_ENV_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|APIKEY|CREDENTIALS?)(_|$)", re.I)
# ...except a variable that names where the secret is: HF_TOKEN_PATH (huggingface_hub's own variable, read as a
# file path), GOOGLE_APPLICATION_CREDENTIALS_FILE, *_DIR. Its value is a path, not the secret, so it passes only
# when the value is an absolute path; HF_TOKEN_PATH=hf_abc... is still a literal secret.
SECRET_PATH_ENV_NAME = re.compile(r"_(PATH|FILE|DIR)$", re.I)
ABSOLUTE_PATH = re.compile(r"^/[^\s]*$")
# Keys under which pod specs (env) and Bitnami-style Helm values (extraEnvVars) list env entries.
ENV_KEYS = ("env", "extraEnvVars", "extraEnv")
EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# Habana publishes one `latest` tag per versioned path, e.g.
# vault.habana.ai/gaudi-docker/1.19.1/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:latest
HABANA_VERSIONED = re.compile(r"^vault\.habana\.ai/gaudi-docker/\d+\.\d+\.\d+/[^:@]+:latest$")


def no_plaintext_secret_env(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Env entries named like credentials must come from a Secret (valueFrom / secretKeyRef), never a
    literal `value`: a value in a pod spec or in Helm values is readable by anyone who can read the
    object (and a Pulumi secret inlined there is plain text in the cluster)."""
    props = props_of(args)
    if not is_kubernetes(args) or args.resource_type == "kubernetes:core/v1:Secret":
        return
    for path, node in walk(props):
        for key in ENV_KEYS:
            entries = node.get(key)
            if not isinstance(entries, list):
                continue
            for i, entry in enumerate(entries):
                if not isinstance(entry, Mapping) or not SECRET_ENV_NAME.search(str(entry.get("name", ""))):
                    continue
                if entry.get("value") not in (None, "") and not names_a_secret_file(entry):
                    where = f"{path}.{key}[{i}]" if path else f"{key}[{i}]"
                    report(f"{where} sets {entry['name']} to a literal value; use valueFrom.secretKeyRef "
                           "(a Kubernetes Secret) instead")


def names_a_secret_file(entry: Mapping[str, Any]) -> bool:
    """HF_TOKEN_PATH=/etc/huggingface/token: a path to a mounted secret, which tells nobody the secret."""
    return bool(SECRET_PATH_ENV_NAME.search(str(entry.get("name", ""))) and ABSOLUTE_PATH.match(str(entry["value"])))


def accelerator_pods_set_resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A container that asks for GPUs or Gaudi cards also requests and limits CPU and memory, so the
    scheduler packs it correctly and a runaway process cannot starve the node's daemons."""
    props = props_of(args)
    if not is_kubernetes(args):
        return
    for path, node in walk(props):
        resources = node.get("resources")
        if not isinstance(resources, Mapping):
            continue
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if not any(a in requests or a in limits for a in ACCELERATORS):
            continue
        where = f"{path}.resources" if path else "resources"
        missing = [f"{part}.{res}" for part, values in (("requests", requests), ("limits", limits))
                   for res in ("cpu", "memory") if res not in values]
        if missing:
            report(f"{where} requests accelerators but has no {', '.join(missing)}")


def image_refs(props: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, reference) of every container image: `image: "ref"` in pod specs, and Bitnami-style
    `image: {registry, repository, tag, digest}` in Helm values."""
    for path, node in walk(props):
        image = node.get("image")
        where = f"{path}.image" if path else "image"
        if isinstance(image, str):
            yield where, image
        elif isinstance(image, Mapping) and image.get("repository"):
            ref = "/".join(str(p) for p in (image.get("registry"), image["repository"]) if p)
            if image.get("tag"):
                ref += f":{image['tag']}"
            if image.get("digest"):
                ref += f"@{image['digest']}"
            yield where, ref


def pinned(ref: str) -> bool:
    """A digest, or a tag that is not `latest`."""
    if DIGEST.search(ref):
        return True
    last = ref.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


def _images(args: ResourceValidationArgs, props: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, reference) of a resource's images: in a Helm release's values, or in the object itself."""
    if args.resource_type in HELM_TYPES:
        for path, ref in image_refs(props.get("values") or {}):
            yield f"values.{path}", ref
    else:
        yield from image_refs(props)


def images_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not is_kubernetes(args) or is_dev(args):
        return
    props = props_of(args)
    if args.resource_type in HELM_TYPES and "bitnamicharts" in str(props.get("chart", "")) and not get(
            props, "values.image.repository"):
        report("values.image is not set: the Bitnami chart's default image moved to docker.io/bitnamilegacy "
               "(Aug 2025) and is not pinned by this stack; set image registry/repository and a digest")
    for path, ref in _images(args, props):
        if SECRET in ref or UNKNOWN in ref or HABANA_VERSIONED.match(ref) or pinned(ref):
            continue  # unknown = the digest of an image built in this update; Habana: see habana_images_by_digest
        report(f"{path} is {ref!r}: pin a digest (@sha256:...) or a fixed tag, never `latest` or no tag")


def habana_images_by_digest(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Habana publishes only a `latest` tag per versioned path (the version is in the path). Accepted,
    but a digest is what makes a rebuild under the same path impossible to pick up by surprise."""
    if not is_kubernetes(args) or is_dev(args):
        return
    for path, ref in _images(args, props_of(args)):
        if HABANA_VERSIONED.match(ref):
            report(f"{path} is {ref!r}: versioned by path only; pin it as ...@sha256:<digest> "
                   "(docker buildx imagetools inspect shows the digest)")


def helm_chart_version_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type not in HELM_TYPES:
        return
    version = str(props.get("version") or "")
    if not EXACT_VERSION.match(version):
        report(f"chart {props.get('chart')!r} has version {version or 'unset'!r}: pin an exact chart version "
               "(e.g. 2.3.51), never a range or the latest")
