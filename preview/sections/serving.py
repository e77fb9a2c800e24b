"""The "Serving" section: each `serve` workload (the `workloads` output): how many replicas, which adapters at which
version, where requests enter, what one replica and the fleet cost per hour and per month (the `costs` output, its
price source named), and the command that sends it a prompt."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any

from preview.engine import RunResult
from preview.sections import Section

HOURS_PER_MONTH = 730  # Google's billing month (planner/cost_markdown.py)


def _node_price(costs: Any, pool: str | None) -> float | None:
    """$/h of one node of the pool, as the pool pays (the `costs` output: max nodes x node price)."""
    p = costs.get("pools", {}).get(pool or "") if isinstance(costs, dict) else None
    if not isinstance(p, dict) or "paysPerHour" not in p or not p.get("maxNodes"):
        return None
    return p["paysPerHour"]["max"] / p["maxNodes"]


def _money(low: float, high: float) -> str:
    return f"${low:,.2f}" if low == high else f"${low:,.2f}-${high:,.2f}"


def costs(s: dict[str, Any], price: float | None) -> tuple[str, str, str]:
    """One replica per hour, the fleet per hour and per month (at its fewest and most replicas): each replica is a
    node of its pool, or `nodesPerReplica` nodes of it across which one replica runs."""
    if price is None:
        return "unknown", "unknown", "unknown"
    nodes = int(s.get("nodesPerReplica") or 1)
    across = f", {nodes} nodes: {s['layout']}" if nodes > 1 else ""  # one replica across nodes (a LeaderWorkerSet)
    price *= nodes
    low, high = s["replicas"], s.get("maxReplicas", s["replicas"])
    return (f"${price:.2f} (pool {s['pool']}{across})", _money(low * price, high * price),
            _money(low * price * HOURS_PER_MONTH, high * price * HOURS_PER_MONTH))


def adapters_text(s: dict[str, Any]) -> str:
    """Each adapter with the version it serves: training's latest export, or the copy the gate last passed."""
    adapters = s.get("adapters") or {}
    if not adapters:
        return "none"
    evaluated = isinstance(s.get("evaluation"), dict)
    return "; ".join(f"{name}: " + (f"the export evals/{name}/served.json names (the gate's last pass)" if evaluated
                                    else f"`{path}` (its latest export)") for name, path in adapters.items())


def entry_text(s: dict[str, Any]) -> str:
    """Where requests enter: the Gateway (its class and how to read its address), or the Service."""
    gateway = s.get("gateway")
    if isinstance(gateway, dict):
        canary = gateway.get("canary")
        share = (f"; {canary['percent']}% of requests to {canary['workload']} (canary)" if isinstance(canary, dict)
                 else "")
        return (f"Gateway {gateway['name']} ({gateway['class']}, {gateway['access']}): "
                f"`{gateway['addressCommand']}`{share}")
    if s.get("service") == "InternalLoadBalancer":
        return f"internal load balancer (Service {s['deployment']}), in the cluster `{s['endpoint']}`"
    return f"Service `{s['endpoint']}` (in the cluster)"


def section(run: RunResult) -> list[Section]:
    """Each `serve` workload: its model, adapters, GPUs, replicas, entry and costs, and how to send it a prompt (the
    command its engine takes: workloads/serving_endpoint.py `prompt_command`)."""
    servers = {name: s for name, s in (run.outputs.get("workloads") or {}).items()
               if isinstance(s, dict) and s.get("kind") == "serve"}
    if not servers:
        return []
    rows = ["| workload | model | adapters (version) | GPUs per replica | replicas | requests enter | $/h one replica "
            "| $/h fleet | $/month fleet |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    commands = []
    for name, s in servers.items():
        one, fleet, month = costs(s, _node_price(run.outputs.get("costs"), s.get("pool")))
        # How it scales: a fixed count, or the autoscaler's bounds and what it reads (workloads/serving_metrics.py).
        replicas = s.get("scaling") or s["replicas"]
        rows.append(f"| {name} | {s['model']} | {adapters_text(s)} | {s['gpusPerReplica']} | {replicas} | "
                    f"{entry_text(s)} | {one} | {fleet} | {month} |")
        if s.get("waitsFor"):  # a model training writes: the server starts once the marker is there
            verb = "exist" if " and " in s["waitsFor"] else "exists"
            commands.append(f"# {name} is Ready once {s['waitsFor']} {verb} (its pods wait in Init until then)")
        commands += [f"{s['portForward']} &", s["prompt"]]
        if isinstance(s.get("evaluation"), dict):
            commands += evaluation_lines(run.stack, name, s["evaluation"])
    prices = (run.outputs.get("costs") or {}).get("priceSource", "data/gpu_catalog.yaml")
    note = (f"Each replica is a node of its pool (or nodesPerReplica nodes), priced as the pool pays (on demand or "
            f"spot) from {prices}; a month is {HOURS_PER_MONTH} hours; a range is the fewest to the most replicas.")
    body = "\n".join(rows) + f"\n\n{note}\n\nSend one prompt (README, \"Serving a model\"):\n\n```sh\n" + \
        "\n".join(commands) + "\n```"
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
