"""The `costs` stack output (planner/cost.py) in words: the headline at the top of the preview's summary
(`headline()`) and its "Estimated cost" section (`costs_markdown()`), rendered from the output itself so the two never
disagree with it.
"""

from __future__ import annotations

from typing import Any

from model import catalog as gpu_catalog
from model.types import StackConfig
from planner import run_estimate
from planner.cost import stack_costs
from planner.pool_cost import SERVING, TRAINING

HOURS_PER_MONTH = 730  # Google's billing month


def _money(value: float) -> str:
    return f"${value:,.2f}"


def headline(costs: dict[str, Any]) -> str:
    """One Markdown line for the top of the summary: $/h with the workloads running, then the floor."""
    running = costs.get("running") or {}
    parts = [f"**{_money(running[r]['perHour'])}/h with {r} running**{_soft_mark(running[r])}"
             for r in (TRAINING, SERVING) if r in running]
    if "all" in running:
        parts.append(f"{_money(running['all']['perHour'])}/h with both{_soft_mark(running['all'])}")
    if costs.get("pools"):
        parts.append(f"floor **{_money(costs['floorPerHour'])}/h** at min nodes")
    vertex = costs.get("vertex")
    if vertex and "perHour" in vertex:
        kinds = [k for k, soft in (("spot price", vertex["spot"]), ("Vertex markup", not vertex["markupConfirmed"]))
                 if soft]
        soft = f" ({' and '.join(kinds)}: estimate)" if kinds else ""
        parts.append(f"Vertex AI job **{_money(vertex['perHour'])}/h** while it runs{soft}")
        if (r := vertex.get("run")) and "missing" not in r:
            parts.append(f"**about {_hours(r)}, {_range(r['perRun'])} per run** on Vertex AI")
    if not parts:
        return "Estimated cost: nothing the stack creates is billed per hour."
    runs = "".join(f" {_run_headline(name, r)}." for name, r in (costs.get("runs") or {}).items())
    stand_in = f", {costs['prices']}" if costs.get("pricedAs") else ""
    return f"Estimated cost: {', '.join(parts)} (list-price estimates{stand_in}; see Estimated cost).{runs}"


def _range(pair: dict[str, float]) -> str:
    return f"{_money(pair['fast'])}–{_money(pair['slow'])}"


def _hours(r: dict[str, Any]) -> str:
    fast, slow = (run_estimate.format_hours(r["hours"][k]) for k in ("fast", "slow"))
    return f"{fast}–{slow} h"


def _mfu(r: dict[str, Any]) -> str:
    low, high = r["mfu"]["low"], r["mfu"]["high"]
    return f"{low:.0%}–{high:.0%}" if low >= 0.01 else f"{low:.1%}–{high:.1%}"


def _run_headline(name: str, r: dict[str, Any]) -> str:
    """`Run tune: **about 1.8–3.9 h, $6.56–$14.37 per run** (spot; on-demand $15.04–$32.94), at the MFU of measured
    runs 23%–27% (data/training_speed.yaml)`: the pool's own prices first."""
    if "missing" in r:
        return f"Run {name}: time and cost unknown ({r['missing']})"
    first, other = (("spot", "onDemand") if r["pays"] == "spot" else ("onDemand", "spot"))
    words = {"spot": "spot", "onDemand": "on-demand"}
    return (f"Run {name}: **about {_hours(r)}, {_range(r['perRun'][first])} per run** ({words[first]}; "
            f"{words[other]} {_range(r['perRun'][other])}), at the MFU of measured runs, {_mfu(r)} "
            "(data/training_speed.yaml)")


def _soft_mark(running: dict[str, Any]) -> str:
    soft = running.get("estimatedAt") or []
    return f" ({' and '.join(soft)} prices: estimate)" if soft else ""


def _pools_table(pools: dict[str, Any]) -> list[str]:
    lines = ["| pool | machine | accelerators | nodes | capacity | on-demand $/h (min → max) | spot $/h (min → max) "
             "| pays |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in pools.items():
        head = (f"| {name} | {p['machineType']} | {p.get('accelerator', '—')} | {p['minNodes']}–{p['maxNodes']} "
                f"| {p.get('capacity', '')} ")
        if "paysPerHour" not in p:
            lines.append(head + "| unknown | unknown | — |")
            continue
        od, spot = p["onDemandPerHour"], p["spotPerHour"]
        lines.append(head + f"| {_money(od['min'])} → {_money(od['max'])} | {_money(spot['min'])} → "
                     f"{_money(spot['max'])} | {'spot' if p['spot'] else 'on-demand'} |")
    return lines


def _running_lines(costs: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in ((TRAINING, "training"), (SERVING, "serving"), ("all", "all workloads")):
        r = (costs.get("running") or {}).get(key)
        if r:
            nodes = ", ".join(f"{pool} {n}" for pool, n in r["nodes"].items())
            lines.append(f"- With {label} running ({', '.join(r['workloads'])}): **{_money(r['perHour'])}/h**"
                         f"{_soft_mark(r)} (nodes: {nodes}).")
    return lines


def _filestore_lines(fs: dict[str, Any]) -> list[str]:
    lines = []
    for c in fs["claims"]:
        price = f"{_money(c['perHour'])}/h" if c["perHour"] is not None else "unpriced (tier price not in the catalog)"
        lines.append(f"- Filestore claim `{c['claim']}` of {c['workload']} ({c['storageClass']}, {c['tier']}): "
                     f"{c['requested']} requested, {c['billedGiB']} GiB billed: {price}, for as long as it exists.")
    return [*lines, f"  Prices from {fs['priceSource']}."]


def _vertex_run_line(v: dict[str, Any]) -> list[str]:
    r = v.get("run")
    if not r:
        return []
    if "missing" in r:
        return [f"- Vertex AI run: no estimate of its time and cost: {r['missing']}."]
    tps, notes = r["tokensPerSecondPerGpu"], "".join(f"; {n}" for n in r["notes"])
    return [f"- Vertex AI run: {r['tokens']:,.0f} tokens ({r['tokensFrom']}) on {r['gpus']} x {r['gpu']} "
            f"({r['precision']}, {r['peakTflops']:g} TFLOPS peak): **about {_hours(r)}, {_range(r['perRun'])} per "
            f"run** at {_money(r['perHour'])}/h (training {run_estimate.format_hours(r['trainingHours']['fast'])}–"
            f"{run_estimate.format_hours(r['trainingHours']['slow'])} h + {r['saves']['count']:,} saves "
            f"{run_estimate.format_hours(r['saves']['hours'])} h); MFU {_mfu(r)} ({tps['low']:,.0f}–{tps['high']:,.0f} "
            f"tokens/s per GPU), the measured runs' {', '.join(r['evidence'])}{notes}."]


def _vertex_lines(v: dict[str, Any]) -> list[str]:
    if "perHour" not in v:
        return [f"- Vertex AI job: {v['replicas']} x {v['machineType']} + {v['accelerator']}: {v['price']}.",
                *_vertex_run_line(v)]
    sure = "" if v["markupConfirmed"] else ", unconfirmed"
    return [f"- Vertex AI job while it runs: {v['replicas']} replica(s) x ({v['machineType']} + {v['accelerator']}"
            f"{', spot' if v['spot'] else ''}) x {v['markup']:g} Vertex markup{sure} = **{_money(v['perHour'])}/h**.",
            f"  Prices from {v['priceSource']}.", *_vertex_run_line(v)]


def _parts(r: dict[str, Any]) -> str:
    """`training 1.1–1.3 h + 12 saves 0.40 h + data step 0.02–0.05 h`."""
    train = r["trainingHours"]
    parts = [f"training {run_estimate.format_hours(train['fast'])}–{run_estimate.format_hours(train['slow'])} h"]
    if s := r.get("saves"):
        parts.append(f"{s['count']:,} saves (every {s['saveSteps']:,} of ~{s['steps']:,} steps, "
                     f"{s['secondsEach']:,.0f} s each on {s['storage']}) {run_estimate.format_hours(s['hours'])} h")
    if d := r.get("dataStep"):
        fast, slow = (run_estimate.format_hours(d["hours"][k]) for k in ("fast", "slow"))
        parts.append(f"the data step on {d['on']} {fast if fast == slow else f'{fast}–{slow}'} h")
    return " + ".join(parts)


def _waiting_words(r: dict[str, Any]) -> str:
    waiting = r.get("waitingNodes") or {}
    return "".join(f", with pool {pool}'s {n} node(s) up and waiting (a server)" for pool, n in waiting.items())


def _reservation_lines(name: str, r: dict[str, Any]) -> list[str]:
    """When the run goes past its reservation's end and what happens then (README, Training at scale)."""
    res = r.get("reservation")
    if not res:
        return []
    ends = (f"  Reservation `{res['name']}` of pool {r['pool']} ends {res['endTime']}, "
            f"{res['hoursLeft']:,.1f} h after {res['from']} (now)")
    past = res["pastEnd"]
    if past["slow"] <= 0:
        return [f"{ends}: the run ends before it, even at its slow end, if it starts now."]
    hours = f"{run_estimate.format_hours(past['fast'])}–{run_estimate.format_hours(past['slow'])} h"
    fb = res.get("fallback")
    if fb is None:
        return [f"{ends}: **the run goes past it** by {hours} if it starts now, and has no priced fallbackPool."]
    note = f" ({fb['note']})" if fb["note"] else ""
    moves = (f"the reservation's Kueue flavor has no quota left, and Kueue admits `{name}` again on fallbackPool "
             f"{fb['pool']}" if fb["queued"] else f"GKE's ComputeClass grows fallbackPool {fb['pool']} instead")
    return [f"{ends}: **the run goes past it** by {hours} if it starts now. Then its nodes go away, {moves} "
            f"({fb['capacity']}), where it continues from its newest checkpoint without a redeploy: those {hours} "
            f"cost {_range(fb['cost'])} at {_money(fb['perHour'])}/h{note}."]


def _run_lines(runs: dict[str, Any]) -> list[str]:
    """Each finetune run in all: its tokens, FLOPs and GPUs, its hours (training, saves, data step) and $ at the spot
    and on-demand $/h with every node up meanwhile, the MFU of the measured runs it rests on (named), and the
    saves' warning."""
    lines = []
    for name, r in runs.items():
        what = f"{r['training']}; {r['strategy']} on {r['gpus']} x {r['gpu']}, {r['precision']}"
        if "missing" in r:
            lines.append(f"- Run `{name}` ({what}): no estimate of its time and cost: {r['missing']}. `make gpus "
                         "MODEL=... MODE=finetune DATA=<a local copy of the data>` counts a file's tokens.")
            continue
        tps = r["tokensPerSecondPerGpu"]
        notes = "".join(f"; {n}" for n in r.get("notes", []))
        lines += [
            f"- Run `{name}` ({what}): {r['tokens']:,.0f} tokens ({r['tokensFrom']}) x "
            f"{r['modelFlopsPerToken'] / 1e9:,.1f} GFLOPs per token ({r['modelFlopsPerToken'] / r['parameters']:g}N, "
            f"N = {r['parameters'] / 1e9:.2f}B parameters) on {r['gpus']} GPUs of {r['peakTflops']:g} "
            f"TFLOPS peak ({r['precision']}, dense): **about {_hours(r)}, {_range(r['perRun']['spot'])} per run at "
            f"spot prices** ({_money(r['perHour']['spot'])}/h{_waiting_words(r)}), {_range(r['perRun']['onDemand'])} "
            f"on-demand ({_money(r['perHour']['onDemand'])}/h); the pool pays "
            f"{'spot' if r['pays'] == 'spot' else 'on-demand'}. Hours: {_parts(r)}.",
            f"  MFU {_mfu(r)} ({tps['low']:,.0f}–{tps['high']:,.0f} tokens/s per GPU): the range of the measured runs "
            f"it rests on, {', '.join(r['evidence'])}{notes}. From {r['source']}. Not in it: restarts after "
            "preemption, padding to a batch's longest sample, the model's download, the export at the end.",
            *([f"  **Warning**: {r['saves']['warning']}."] if r.get("saves", {}).get("warning") else []),
            *_reservation_lines(name, r)]
    return lines


def costs_markdown(costs: dict[str, Any]) -> str:
    """The `costs` output as Markdown (the running and floor figures, a table, the caveats), without a heading:
    the caller titles it."""
    pools, vertex = costs.get("pools", {}), costs.get("vertex")
    if not pools and not vertex:
        return "No GKE cluster in this stack: nothing the stack creates is billed per hour.\n"
    lines = _running_lines(costs)
    if costs.get("runs"):
        lines += _run_lines(costs["runs"])
    if pools:
        at_max = costs["stackPerHourAtMax"]
        lines += [f"- Floor, every pool at min nodes{' with Filestore' if costs.get('filestore') else ''}: "
                  f"**{_money(costs['floorPerHour'])}/h**; every pool at max nodes: {_money(at_max)}/h "
                  f"(≈ {_money(at_max * HOURS_PER_MONTH)} per {HOURS_PER_MONTH}-hour month).", ""]
        lines += _pools_table(pools)
        lines += ["", f"GKE cluster fee {_money(costs['clusterFeePerHour'])}/h."]
    if costs.get("filestore"):
        lines += ["", *_filestore_lines(costs["filestore"])]
    if vertex:
        lines += ["", *_vertex_lines(vertex)] if lines else _vertex_lines(vertex)
    lines += ["", f"Estimates in {costs['currency']} from {costs['priceSource']}: {costs['prices']}; disks, "
              "network egress and Cloud Storage are not included."]
    lines += costs.get("estimates", [])
    if costs.get("unpriced"):
        lines.append(f"Not priced (machine type missing from the catalog): {', '.join(costs['unpriced'])}.")
    return "\n".join([*lines, ""])


def cost_section(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> str:
    """Markdown for the preview summary: the same numbers as the `costs` output."""
    return costs_markdown(stack_costs(cfg, cat))
