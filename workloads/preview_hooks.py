"""The offline preview writes the Vertex AI CustomJob spec beside plan.json, ready for
`gcloud ai custom-jobs create --region=REGION --display-name=NAME --config=vertex-customjob.yaml`, and each
MPIJob's pod templates as Pods under pods/, for scanners that do not know the MPIJob kind
(`make checkov STACK=gaudi`: checkov's Kubernetes checks on them and the NetworkPolicies in manifests/)."""

from __future__ import annotations

import yaml

from preview import hooks
from preview.engine import RunResult

SPEC_FILE = "vertex-customjob.yaml"


@hooks.artifact
def vertex_customjob(run: RunResult) -> dict[str, str]:
    spec = run.outputs.get("vertexCustomJob")
    if not isinstance(spec, dict):
        return {}
    header = ("# Vertex AI CustomJob spec rendered by deepspeed-stack's offline preview (placeholder names).\n"
              "# gcloud ai custom-jobs create --region=REGION --display-name=deepspeed-training "
              f"--config={SPEC_FILE}\n")
    return {SPEC_FILE: header + yaml.safe_dump(spec, sort_keys=False)}


@hooks.section
def vertex_summary(run: RunResult) -> list[hooks.Section]:
    spec = run.outputs.get("vertexCustomJob")
    if not isinstance(spec, dict):
        return []
    rows = ["| pool | replicas | machine | accelerators |", "| --- | --- | --- | --- |"]
    for i, pool in enumerate(spec["workerPoolSpecs"]):
        m = pool["machineSpec"]
        rows.append(f"| workerpool{i} | {pool['replicaCount']} | {m['machineType']} | "
                    f"{m.get('acceleratorCount', 0)} x {m.get('acceleratorType', '-')} |")
    output_dir = spec["baseOutputDirectory"]["outputUriPrefix"]
    body = "\n".join(rows) + f"\n\nSpec written to `{SPEC_FILE}`; output dir `{output_dir}`."
    return [("Vertex AI CustomJob", body)]


MPIJOB_TYPE = "kubernetes:kubeflow.org/v2beta1:MPIJob"


@hooks.artifact
def mpijob_pods(run: RunResult) -> dict[str, str]:
    """pods/<job>-<role>.yaml: each replica's pod template as the Pod the operator would create from it."""
    files = {}
    for reg in run.by_type(MPIJOB_TYPE):
        meta = reg.inputs.get("metadata") or {}
        for role, replica in (reg.inputs.get("spec") or {}).get("mpiReplicaSpecs", {}).items():
            template = replica.get("template") or {}
            name = f"{meta.get('name', reg.name)}-{role.lower()}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": meta.get("namespace", "default"),
                                **(template.get("metadata") or {})},
                   "spec": template.get("spec") or {}}
            files[f"pods/{name}.yaml"] = yaml.safe_dump(pod, sort_keys=False)
    return files
