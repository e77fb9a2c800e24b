"""`python -m preview --stack dev` as a user runs it: a fresh interpreter, free of whatever the other tests
imported or registered, writing to a folder of its own. What it wrote is checked against the stack file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml
from conftest import PROJECT_DIR, stack_yaml


def test_python_m_preview_writes_the_plan_the_summary_and_the_manifests(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "preview", "--stack", "dev", "--out", str(tmp_path)],
                            cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "dev"
    assert result.stdout.rstrip().endswith(f"wrote {out}/: plan.json, summary.md, 2 file(s) in manifests/, "
                                           "2 file(s) in helm/")
    smoke = stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "helm/smoke.chart.yaml", "helm/smoke.values.yaml",
        f"manifests/01-namespace-{smoke['namespace']}.yaml", "manifests/02-configmap-smoke-source.yaml",
        "plan.json", "summary.md"]

    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    jsonschema.validate(plan, json.loads((PROJECT_DIR / "preview" / "plan.schema.json").read_text(encoding="utf-8")))
    assert (plan["project"], plan["stack"]) == ("deepspeed-stack", "dev")
    (pool,) = [r for r in plan["resources"] if r["type"] == "gcp:container/nodePool:NodePool" and r["name"] == "t4"]
    declared = stack_yaml("dev")["deepspeed-stack:nodePools"][0]
    assert (pool["inputs"]["nodeConfig"]["machineType"], pool["inputs"]["nodeConfig"]["spot"]) == (
        declared["machineType"], declared["spot"])
    (release,) = [r for r in plan["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"]
    assert release["inputs"]["namespace"] == smoke["namespace"]
    assert {"costs", "capacityPlan", "workloads"} <= plan["outputs"].keys()

    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("### Stack `dev`: ")
    titles = [line.removeprefix("#### ") for line in summary.splitlines() if line.startswith("#### ")]
    assert titles == ["Resources", "GPU inventory", "Workloads", "Policy", "Estimated cost", "Capacity plan"]
    namespace = yaml.safe_load((out / f"manifests/01-namespace-{smoke['namespace']}.yaml").read_text())
    assert (namespace["kind"], namespace["metadata"]["name"]) == ("Namespace", smoke["namespace"])
