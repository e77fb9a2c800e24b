"""The offline preview writes the Vertex AI CustomJob spec beside plan.json, ready for
`gcloud ai custom-jobs create --region=REGION --display-name=NAME --config=vertex-customjob.yaml`, and each
MPIJob's pod templates as Pods under pods/, for scanners that do not know the MPIJob kind
(`make checkov STACK=gaudi`: checkov's Kubernetes checks on them and the NetworkPolicies in manifests/).
A "Serving" section lists each `serve` workload with its cost and the command that sends it a prompt."""

from __future__ import annotations

from typing import Any

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


def _node_price(costs: Any, pool: str | None) -> float | None:
    """$/h of one node of the pool, as the pool pays (the `costs` output: max nodes x node price)."""
    p = costs.get("pools", {}).get(pool or "") if isinstance(costs, dict) else None
    if not isinstance(p, dict) or "paysPerHour" not in p or not p.get("maxNodes"):
        return None
    return p["paysPerHour"]["max"] / p["maxNodes"]


@hooks.section
def serving_summary(run: RunResult) -> list[hooks.Section]:
    """Each `serve` workload: its model, GPUs, what a replica costs, and how to send it a prompt."""
    servers = {name: s for name, s in (run.outputs.get("workloads") or {}).items()
               if isinstance(s, dict) and s.get("kind") == "serve"}
    if not servers:
        return []
    rows = ["| workload | model | GPUs per replica | replicas | $/h per replica | endpoint (in the cluster) |",
            "| --- | --- | --- | --- | --- | --- |"]
    commands = []
    for name, s in servers.items():
        price = _node_price(run.outputs.get("costs"), s.get("pool"))
        cost = f"${price:.2f} (pool {s['pool']})" if price is not None else "unknown"
        rows.append(f"| {name} | {s['model']} | {s['gpusPerReplica']} | {s['replicas']} | {cost} | "
                    f"`{s['endpoint']}` |")
        commands += [f"{s['portForward']} &",
                     f"python workloads/scripts/send_prompt.py --deployment {name} \"What is DeepSpeed?\""]
    body = "\n".join(rows) + "\n\nSend one prompt (README, \"Serving a model\"):\n\n```sh\n" + "\n".join(commands) + \
        "\n```"
    return [("Serving", body)]
