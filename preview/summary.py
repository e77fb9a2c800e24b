"""The preview's summary: resource counts, the GPU inventory, the workloads and where they run, policy
results, the diff against a base plan, and any extra sections (preview/sections/).

One set of tables, two renderings: aligned text for the terminal, Markdown for summary.md (a PR comment).
Everything is read from the recorded registrations, so new resource kinds show up without changes here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec

from planner.cost_markdown import headline as cost_headline
from preview import replacements
from preview.diff import PlanDiff, render_markdown, render_text
from preview.engine import Registration, RunResult
from preview.policy_check import Violation
from preview.sections import Section

NODE_POOL = "gcp:container/nodePool:NodePool"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
MPIJOB_SUFFIX = ":MPIJob"
SERVER_DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVER_COMPONENT = "deepspeed-stack:workloads:ModelServer"
POOL_LABEL = "deepspeed-stack/pool"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
ACCELERATORS = ("nvidia.com/gpu", "habana.ai/gaudi")


class Table(msgspec.Struct, frozen=True):
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""  # a line under the title (Markdown allowed, shown as-is in the terminal)
    empty: str = "none"


class GpuPool(msgspec.Struct, frozen=True):
    pool: str
    machine_type: str
    gpu_type: str
    gpus_per_node: int
    min_nodes: int | None
    max_nodes: int | None
    spot: bool
    zones: list[str] = msgspec.field(default_factory=list)
    capacity: str = ""  # reservation NAME | DWS queued | DWS flex-start | spot | on-demand


class Workload(msgspec.Struct, frozen=True):
    name: str
    kind: str
    namespace: str
    runs_on: str
    accelerators: str  # per worker, e.g. "nvidia.com/gpu x 1"
    workers: int | None


def _get(value: Any, *path: str | int) -> Any:
    for part in path:
        if isinstance(value, dict) and isinstance(part, str):
            value = value.get(part)
        elif isinstance(value, list) and isinstance(part, int) and -len(value) <= part < len(value):
            value = value[part]
        else:
            return None
    return value


# --- facts ---------------------------------------------------------------------------------------

def counts(run: RunResult) -> list[tuple[str, int]]:
    return sorted(Counter(r.type for r in run.resources).items())


def _capacity(pool: dict[str, Any], node: dict[str, Any]) -> str:
    """Where the pool's nodes come from, as its recorded inputs say (README, Capacity and queueing)."""
    affinity = node.get("reservationAffinity") or {}
    if affinity.get("consumeReservationType") == "SPECIFIC_RESERVATION":
        return "reservation " + ", ".join(affinity.get("values") or [])
    if (pool.get("queuedProvisioning") or {}).get("enabled"):
        return "DWS queued"
    if node.get("flexStart"):
        return "DWS flex-start"
    return "spot" if node.get("spot") or node.get("preemptible") else "on-demand"


def gpu_inventory(run: RunResult) -> list[GpuPool]:
    pools = []
    for reg in run.by_type(NODE_POOL):
        node = reg.inputs.get("nodeConfig") or {}
        for acc in node.get("guestAccelerators") or []:
            scaling = reg.inputs.get("autoscaling") or {}
            fixed = reg.inputs.get("nodeCount", reg.inputs.get("initialNodeCount"))
            pools.append(GpuPool(
                pool=(node.get("labels") or {}).get(POOL_LABEL, reg.name),
                machine_type=str(node.get("machineType", "?")),
                gpu_type=str(acc.get("type", "?")),
                gpus_per_node=int(acc.get("count", 0)),
                min_nodes=scaling.get("totalMinNodeCount", scaling.get("minNodeCount", fixed)),
                max_nodes=scaling.get("totalMaxNodeCount", scaling.get("maxNodeCount", fixed)),
                spot=bool(node.get("spot") or node.get("preemptible")),
                zones=list(reg.inputs.get("nodeLocations") or []),
                capacity=_capacity(reg.inputs, node),
            ))
    return pools


def _limits(resources: Any) -> tuple[str, int]:
    limits = {**(_get(resources, "requests") or {}), **(_get(resources, "limits") or {})}
    for name in ACCELERATORS:
        if name in limits:
            return name, int(str(limits[name]))
    return "", 0


def _runs_on(selector: dict[str, str] | None, accelerator: str) -> str:
    selector = selector or {}
    if POOL_LABEL in selector:
        gpu = selector.get(GKE_ACCELERATOR)
        return f"pool {selector[POOL_LABEL]}" + (f" ({gpu})" if gpu else "")
    if GKE_ACCELERATOR in selector:
        return f"nodes with {selector[GKE_ACCELERATOR]}"
    if accelerator == "habana.ai/gaudi":
        return "Gaudi nodes (habana.ai/gaudi)"
    return ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "any node"


def _per_worker(resource: str, count: int) -> str:
    return f"{resource} x {count}" if resource else "none"


def _helm_workload(reg: Registration) -> Workload:
    values = reg.inputs.get("values") or {}
    worker = values.get("worker") or {}
    resource, count = _limits(worker.get("resources"))
    chart = str(reg.inputs.get("chart", "")).rsplit("/", 1)[-1]
    return Workload(
        name=str(reg.inputs.get("name") or reg.physical_name or reg.name),
        kind=f"Helm {chart} {reg.inputs.get('version', '')}".strip(),
        namespace=str(reg.inputs.get("namespace", "default")),
        runs_on=_runs_on(worker.get("nodeSelector"), resource),
        accelerators=_per_worker(resource, count),
        workers=worker.get("replicaCount") if worker.get("enabled", True) else 0,
    )


def _mpijob_workload(reg: Registration) -> Workload:
    worker = _get(reg.inputs, "spec", "mpiReplicaSpecs", "Worker") or {}
    pod = _get(worker, "template", "spec") or {}
    resource, count = _limits(_get(pod, "containers", 0, "resources"))
    meta = reg.inputs.get("metadata") or {}
    return Workload(
        name=str(meta.get("name") or reg.physical_name or reg.name),
        kind=f"MPIJob {str(reg.inputs.get('apiVersion', '')).rsplit('/', 1)[-1]}".strip(),
        namespace=str(meta.get("namespace", "default")),
        runs_on=_runs_on(pod.get("nodeSelector"), resource),
        accelerators=_per_worker(resource, count),
        workers=worker.get("replicas"),
    )


def _server_engine(container: dict) -> str:
    """vLLM runs its OpenAI server module; MII the stack's entry script (workloads/serving_command.py `command`)."""
    return "vLLM" if any("vllm" in str(part) for part in container.get("command") or []) else "DeepSpeed-MII"


def _server_workload(reg: Registration) -> Workload:
    """A `serve` workload's Deployment (workloads/serving.py): one pod per replica."""
    pod = _get(reg.inputs, "spec", "template", "spec") or {}
    resource, count = _limits(_get(pod, "containers", 0, "resources"))
    meta = reg.inputs.get("metadata") or {}
    return Workload(
        name=str(meta.get("name") or reg.physical_name or reg.name),
        kind=f"{_server_engine(_get(pod, 'containers', 0) or {})} server (Deployment)",
        namespace=str(meta.get("namespace", "default")),
        runs_on=_runs_on(pod.get("nodeSelector"), resource),
        accelerators=_per_worker(resource, count),
        workers=_get(reg.inputs, "spec", "replicas"),
    )


def workloads(run: RunResult) -> list[Workload]:
    found = []
    for reg in run.resources:
        if reg.type == HELM_RELEASE:
            found.append(_helm_workload(reg))
        elif reg.type.startswith("kubernetes:") and reg.type.endswith(MPIJOB_SUFFIX):
            found.append(_mpijob_workload(reg))
        elif reg.type == SERVER_DEPLOYMENT and run.index().get(reg.parent or "", reg).type == SERVER_COMPONENT:
            found.append(_server_workload(reg))
    return found


# --- tables --------------------------------------------------------------------------------------

def _nodes(p: GpuPool) -> str:
    return f"{p.min_nodes}..{p.max_nodes}" if p.min_nodes != p.max_nodes else str(p.max_nodes)


def tables(run: RunResult, violations: Sequence[Violation], policies_run: int) -> list[Table]:
    type_counts = counts(run)
    custom = sum(1 for r in run.resources if r.custom)
    pools = gpu_inventory(run)
    max_gpus = sum(p.gpus_per_node * (p.max_nodes or 0) for p in pools)
    out = [
        Table("Resources", ["type", "count"], [[t, str(n)] for t, n in type_counts],
              note=f"{len(run.resources)} resources to create: {custom} cloud/Kubernetes resources and "
                   f"{len(run.resources) - custom} components."),
        Table("GPU inventory", ["pool", "machine", "GPUs per node", "nodes", "capacity", "zones"],
              [[p.pool, p.machine_type, f"{p.gpu_type} x {p.gpus_per_node}", _nodes(p),
                p.capacity or ("spot" if p.spot else "on-demand"), ", ".join(p.zones) or "region default"]
               for p in pools],
              note=f"At most {max_gpus} GPU(s) when every pool is at its maximum." if pools else "",
              empty="no GPU node pools in this stack"),
        Table("Workloads", ["workload", "kind", "namespace", "runs on", "accelerators per worker", "workers"],
              [[w.name, w.kind, w.namespace, w.runs_on, w.accelerators, "" if w.workers is None else str(w.workers)]
               for w in workloads(run)], empty="no workloads in this stack"),
    ]
    mandatory = [v for v in violations if v.mandatory]
    note = (f"{policies_run} policies checked on {len(run.resources)} resources: "
            f"{len(mandatory)} mandatory violation(s), {len(violations) - len(mandatory)} advisory.")
    out.append(Table("Policy", ["level", "policy", "resource", "message"],
                     [[v.level, v.policy, f"{v.type} {v.name}", v.message] for v in violations],
                     note=note, empty="all policies pass"))
    return out


# --- rendering -----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(t: Table) -> str:
    lines = [f"#### {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    if not t.rows:
        return "\n".join([*lines, f"_{t.empty}_"])
    lines.append("| " + " | ".join(t.headers) + " |")
    lines.append("| " + " | ".join("---" for _ in t.headers) + " |")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def table_text(t: Table) -> str:
    lines = [t.title]
    if t.note:
        lines.append(f"  {t.note}")
    if not t.rows:
        return "\n".join([*lines, f"  ({t.empty})"])
    widths = [max(len(h), *(len(r[i]) for r in t.rows)) for i, h in enumerate(t.headers)]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(t.headers, widths, strict=True)).rstrip())
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in t.rows]
    return "\n".join(lines)


def warnings_markdown(warnings: Sequence[str]) -> str:
    """At the top of summary.md: what the reviewer must read even when the stack previews cleanly."""
    return "\n".join(["#### Warnings", "", *(f"- :warning: {w}" for w in warnings)])


_SEPARATOR_CELL = re.compile(r"^:?-+:?$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_EMPHASIS = re.compile(r"\*\*|`")
_FENCE = re.compile(r"^\s*```")  # a code block's opening (```sh) or closing line: Markdown, not text


def _plain(text: str) -> str:
    return _EMPHASIS.sub("", text).replace("\\|", "|")


def markdown_text(body: str) -> str:
    """A section's Markdown (from a hook) for the terminal: tables aligned like the built-in ones,
    emphasis, code marks and code fences dropped (the block's lines stay), every line indented under its title."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            header, *rows = table
            rows = [r for r in rows if not all(_SEPARATOR_CELL.match(c) for c in r)]
            width = len(header)
            rows = [(r + [""] * width)[:width] for r in rows]
            out.extend(table_text(Table("", header, rows)).splitlines()[1:])
            table.clear()

    for line in body.splitlines():
        if line.strip().startswith("|"):
            cells = _CELL_SPLIT.split(line.strip().strip("|"))
            table.append([_plain(c.strip()) for c in cells])
            continue
        flush()
        if _FENCE.match(line):
            continue
        out.append(f"  {_plain(line)}".rstrip())
    flush()
    return "\n".join(out)


def markdown(run: RunResult, violations: Sequence[Violation], policies_run: int, plan_diff: PlanDiff | None = None,
             extra: Sequence[Section] = ()) -> str:
    """summary.md: a PR comment for one stack."""
    mandatory = sum(1 for v in violations if v.mandatory)
    status = "policy violations" if mandatory else "ok"
    if run.warnings:
        status += f", {len(run.warnings)} warning{'s' if len(run.warnings) != 1 else ''}"
    parts = [f"### Stack `{run.stack}`: {len(run.resources)} resources, {status}"]
    if isinstance(run.outputs.get("costs"), dict):  # $/h with the workloads running, then the floor
        parts.append(cost_headline(run.outputs["costs"]))
    if run.warnings:
        parts.append(warnings_markdown(run.warnings))
    if plan_diff is not None:
        parts.append("#### Changes against the base branch\n\n" + render_markdown(plan_diff))
        if replaced := replacements.replacements(plan_diff, run):
            parts.append(replacements.render_markdown(replaced))
    parts += [table_markdown(t) for t in tables(run, violations, policies_run)]
    parts += [f"#### {title}\n\n{body}" for title, body in extra]
    return "\n\n".join(parts) + "\n"


def text(run: RunResult, violations: Sequence[Violation], policies_run: int, plan_diff: PlanDiff | None = None,
         extra: Sequence[Section] = ()) -> str:
    parts = [table_text(t) for t in tables(run, violations, policies_run)]
    if isinstance(run.outputs.get("costs"), dict):
        parts.insert(0, markdown_text(cost_headline(run.outputs["costs"])).strip())
    if plan_diff is not None:
        replaced = replacements.replacements(plan_diff, run)
        parts[:0] = [render_text(plan_diff), *([replacements.render_text(replaced)] if replaced else [])]
    parts += [f"{title}\n{markdown_text(body)}" for title, body in extra]
    return "\n\n".join(parts)
