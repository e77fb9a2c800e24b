"""The "Serving" section: each `serve` workload (the `workloads` output) with its cost (the `costs` output) and
the command that sends it a prompt."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any

from preview.engine import RunResult
from preview.sections import Section


def _node_price(costs: Any, pool: str | None) -> float | None:
    """$/h of one node of the pool, as the pool pays (the `costs` output: max nodes x node price)."""
    p = costs.get("pools", {}).get(pool or "") if isinstance(costs, dict) else None
    if not isinstance(p, dict) or "paysPerHour" not in p or not p.get("maxNodes"):
        return None
    return p["paysPerHour"]["max"] / p["maxNodes"]


def section(run: RunResult) -> list[Section]:
    """Each `serve` workload: its model, GPUs, what a replica costs, and how to send it a prompt (the command its
    engine takes: workloads/serving_endpoint.py `prompt_command`)."""
    servers = {name: s for name, s in (run.outputs.get("workloads") or {}).items()
               if isinstance(s, dict) and s.get("kind") == "serve"}
    if not servers:
        return []
    rows = ["| workload | model | GPUs per replica | replicas | $/h per replica | endpoint (in the cluster) |",
            "| --- | --- | --- | --- | --- | --- |"]
    commands = []
    for name, s in servers.items():
        price, nodes = _node_price(run.outputs.get("costs"), s.get("pool")), int(s.get("nodesPerReplica") or 1)
        across = f", {nodes} nodes: {s['layout']}" if nodes > 1 else ""  # one replica across nodes
        cost = f"${price * nodes:.2f} (pool {s['pool']}{across})" if price is not None else "unknown"
        # How it scales: a fixed count, or the autoscaler's bounds and what it reads (workloads/serving_metrics.py).
        replicas = s.get("scaling") or s["replicas"]
        rows.append(f"| {name} | {s['model']} | {s['gpusPerReplica']} | {replicas} | {cost} | "
                    f"`{s['endpoint']}` |")
        if s.get("waitsFor"):  # a model training writes: the server starts once the marker is there
            verb = "exist" if " and " in s["waitsFor"] else "exists"
            commands.append(f"# {name} is Ready once {s['waitsFor']} {verb} (its pods wait in Init until then)")
        commands += [f"{s['portForward']} &", s["prompt"]]
        if isinstance(s.get("evaluation"), dict):
            commands += evaluation_lines(run.stack, name, s["evaluation"])
    body = "\n".join(rows) + "\n\nSend one prompt (README, \"Serving a model\"):\n\n```sh\n" + "\n".join(commands) + \
        "\n```"
    return [("Serving", body)]


def evaluation_lines(stack: str, name: str, ev: dict[str, Any]) -> list[str]:
    """The evaluator's next steps: what it scores on, where results.json lands, how the gate decides."""
    bucket = f"gs://$(pulumi stack output bucket -s {shlex.quote(stack)})"
    return [f"# {name} serves an adapter only once scored: its evaluator runs evaluate.py (lm-eval) for each new "
            "export, against the base and the adapter served now, rendered as the export was trained",
            f"# on {ev['task']} of the bucket, records as you trained on (conversations: the last assistant turn is "
            "the reference): upload it",
            f"gcloud storage cp {shlex.quote(PurePosixPath(ev['task']).name)} {bucket}/{ev['task']}",
            *(f"# {adapter}: {text}" for adapter, text in (ev.get("gate") or {}).items()),
            "# until an export has passed, only the base is served (the adapter's name gets a 404)",
            f"{ev['logs']}   # base vs tuned, and the gate's reason",
            *(line for adapter, results in ev.get("results", {}).items() for line in (
                f"# {adapter}: the scores, served true or false, and the reason",
                f"gcloud storage cat {bucket}/{results}"))]
