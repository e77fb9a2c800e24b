"""The Vertex AI CustomJob (the `vertexCustomJob` output): a "Vertex AI CustomJob" section and its spec written
beside plan.json, ready for
`gcloud ai custom-jobs create --region=REGION --display-name=NAME --config=vertex-customjob.yaml`."""

from __future__ import annotations

import yaml

from preview.engine import RunResult
from preview.sections import Section

SPEC_FILE = "vertex-customjob.yaml"


def files(run: RunResult) -> dict[str, str]:
    spec = run.outputs.get("vertexCustomJob")
    if not isinstance(spec, dict):
        return {}
    name = run.outputs.get("vertexDisplayName", "NAME")  # vertex.displayName: the run's folders in the bucket too
    header = ("# Vertex AI CustomJob spec rendered by deepspeed-stack's offline preview (placeholder names).\n"
              f"# gcloud ai custom-jobs create --region=REGION --display-name={name} --config={SPEC_FILE}\n")
    return {SPEC_FILE: header + yaml.safe_dump(spec, sort_keys=False)}


def section(run: RunResult) -> list[Section]:
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
