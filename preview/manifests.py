"""Kubernetes objects and Helm releases of a run, as files `kubectl apply -f` and `helm install` take.

Every custom `kubernetes:*` resource (other than Helm releases and ConfigFile/ConfigGroup/kustomize
components, which stand for many objects) becomes one YAML document in `manifests/`, so `kubectl apply -f
manifests/` takes the folder as it is; each Helm release becomes `helm/<release>.values.yaml` plus
`helm/<release>.chart.yaml` naming chart, version and repository (not Kubernetes objects: kubectl would refuse
them). Values the engine saw as secrets stay "[secret]", and every value of a Secret's `data`/`stringData` is
written as "[secret]" whether or not the program marked it, so no credential reaches a file; a Secret whose
whole `data`/`stringData` was secret (its keys unknown here) gets an empty map and an annotation saying so,
so the object stays valid.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import yaml

from preview.engine import SECRET, Registration, RunResult

HELM_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart", "kubernetes:helm.sh/v3:Chart")
# Components that expand to many objects inside the provider: no single manifest stands for them.
NOT_OBJECTS = ("kubernetes:helm.sh/", "kubernetes:yaml/", "kubernetes:kustomize/")
HEAD_KEYS = ("apiVersion", "kind", "metadata")
SECRET_FIELDS = ("data", "stringData")


class HelmChart(msgspec.Struct, frozen=True):
    release: str
    namespace: str
    chart: str
    version: str
    repository: str
    values: dict[str, Any]


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml's emitter: 10x faster on big scripts
    """Multi-line strings (scripts in ConfigMaps, launch commands) as `|` blocks, so files stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)


def is_object(reg: Registration) -> bool:
    return reg.custom and reg.type.startswith("kubernetes:") and not reg.type.startswith(NOT_OBJECTS)


def api_version_kind(type_token: str) -> tuple[str, str]:
    """`kubernetes:apps/v1:Deployment` -> ("apps/v1", "Deployment"); the core group has no prefix."""
    _, module, kind = type_token.split(":", 2)
    group, _, version = module.rpartition("/")
    return (version if group in ("core", "") else f"{group}/{version}"), kind


REDACTED_ANNOTATION = "deepspeed-stack/redacted"


def _redact_secret(doc: dict[str, Any]) -> dict[str, Any]:
    hidden = []
    for key in SECRET_FIELDS:
        if isinstance(doc.get(key), dict):
            doc[key] = {k: SECRET for k in doc[key]}
        elif key in doc:
            doc[key] = {}  # a secret as a whole: its keys are unknown here; a map keeps the object valid
            hidden.append(key)
    if hidden:
        metadata = doc["metadata"] = dict(doc["metadata"])
        metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                   REDACTED_ANNOTATION: f"{', '.join(hidden)}: secret, not written by the preview"}
    return doc


def manifest(reg: Registration) -> dict[str, Any]:
    """One object as YAML would carry it: apiVersion, kind, metadata (with a name), then the rest."""
    inputs = dict(reg.inputs)
    api_version, kind = api_version_kind(reg.type)
    metadata = dict(inputs.get("metadata") or {})
    # Auto-named objects get their name from the provider; the mock's name stands in for it.
    metadata.setdefault("name", reg.physical_name or reg.name)
    doc: dict[str, Any] = {"apiVersion": inputs.get("apiVersion", api_version), "kind": inputs.get("kind", kind),
                           "metadata": metadata}
    doc.update({k: inputs[k] for k in sorted(inputs) if k not in HEAD_KEYS})
    return _redact_secret(doc) if doc["kind"] == "Secret" else doc


def file_name(index: int, doc: dict[str, Any]) -> str:
    """`03-configmap-smoke-source.yaml`: the index keeps `kubectl apply -f dir/` in registration order
    (namespaces and CRDs before what lives in them)."""
    slug = re.sub(r"[^a-z0-9.-]+", "-", f"{doc['kind']}-{doc['metadata']['name']}".lower())
    return f"{index:02d}-{slug}.yaml"


def _split_chart(chart: str, repo: str | None) -> tuple[str, str]:
    """(chart name, repository): `oci://host/path/name` carries both; otherwise repositoryOpts.repo."""
    if chart.startswith("oci://"):
        repository, _, name = chart.rpartition("/")
        return name, repository
    if repo:
        return chart.rsplit("/", 1)[-1], repo
    repository, _, name = chart.rpartition("/")
    return name, repository


def helm_chart(reg: Registration) -> HelmChart:
    inputs = reg.inputs
    name, repository = _split_chart(str(inputs.get("chart", "")), (inputs.get("repositoryOpts") or {}).get("repo"))
    return HelmChart(release=str(inputs.get("name") or reg.physical_name or reg.name),
                     namespace=str(inputs.get("namespace", "default")), chart=name,
                     version=str(inputs.get("version", "")), repository=repository,
                     values=dict(inputs.get("values") or {}))


def chart_file(chart: HelmChart) -> dict[str, Any]:
    ref = f"{chart.repository}/{chart.chart}" if chart.repository.startswith("oci://") else chart.chart
    repo_flag = "" if chart.repository.startswith("oci://") else f" --repo {chart.repository}"
    return {
        "release": chart.release, "namespace": chart.namespace, "chart": chart.chart, "version": chart.version,
        "repository": chart.repository,
        "install": f"helm install {chart.release} {ref}{repo_flag} --version {chart.version} "
                   f"--namespace {chart.namespace} -f {chart.release}.values.yaml",
    }


def render(run: RunResult) -> dict[str, str]:
    """Relative file name -> content, for build/<stack>/manifests/: Kubernetes objects only."""
    files: dict[str, str] = {}
    objects = [r for r in run.resources if is_object(r)]
    for i, reg in enumerate(objects, start=1):
        doc = manifest(reg)
        files[file_name(i, doc)] = dump(doc)
    return files


def render_helm(run: RunResult) -> dict[str, str]:
    """Relative file name -> content, for build/<stack>/helm/: each release's values and chart files."""
    files: dict[str, str] = {}
    for reg in run.resources:
        if reg.type in HELM_TYPES:
            chart = helm_chart(reg)
            files[f"{chart.release}.values.yaml"] = dump(chart.values)
            files[f"{chart.release}.chart.yaml"] = dump(chart_file(chart))
    return files
