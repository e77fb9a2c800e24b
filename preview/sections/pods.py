"""Each MPIJob's and LeaderWorkerSet's pod templates written as Pods under pods/, for scanners that do not know those
kinds (`make checkov-workloads STACK=<stack>`: checkov's Kubernetes checks on them and the NetworkPolicies in
manifests/)."""

from __future__ import annotations

import yaml

from preview.engine import RunResult
from workloads import serving_group

MPIJOB_TYPE = "kubernetes:kubeflow.org/v2beta1:MPIJob"


def files(run: RunResult) -> dict[str, str]:
    """pods/<job>-<role>.yaml: each replica's pod template as the Pod the operator would create from it."""
    out = {}
    for reg in run.by_type(MPIJOB_TYPE):
        meta = reg.inputs.get("metadata") or {}
        for role, replica in (reg.inputs.get("spec") or {}).get("mpiReplicaSpecs", {}).items():
            template = replica.get("template") or {}
            name = f"{meta.get('name', reg.name)}-{role.lower()}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": meta.get("namespace", "default"),
                                **(template.get("metadata") or {})},
                   "spec": template.get("spec") or {}}
            out[f"pods/{name}.yaml"] = yaml.safe_dump(pod, sort_keys=False)
    for reg in run.by_type(serving_group.TYPE_TOKEN):  # a server across nodes: its leader and a worker
        lws = {"metadata": reg.inputs.get("metadata") or {"name": reg.name}, "spec": reg.inputs.get("spec") or {}}
        for pod in serving_group.pods(lws).values():
            out[f"pods/{pod['metadata']['name']}.yaml"] = yaml.safe_dump(pod, sort_keys=False)
    return out
