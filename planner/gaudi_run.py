"""How long a Gaudi job's fine-tuning run takes, before it starts: the planner's run estimate (planner/run_estimate.py
`estimate`, its public entry point, the same FLOPs, MFU range and LoRA/ZeRO factors as a GKE run) on the cards' peak
dense BF16 TFLOPS (data/gpu_catalog.yaml `gaudi.<type>.peakTflops`). An existing cluster has no price the stack
knows, so the run is said in hours and card-hours, not dollars.

The MFU range is data/training_speed.yaml's, measured and assumed for GPUs: what Gaudi reaches on finetune.py under
optimum-habana's GaudiTrainer is not measured here [U], so the range is the GPUs' at the Gaudi card's peak."""

from __future__ import annotations

import msgspec

from model import catalog as gpu_catalog
from model.types import MpiJobWorkloadConfig
from planner.requests import workload_request, workload_strategy
from planner.run_estimate import RunEstimate, estimate, hours_range, mfu_range, run_tokens


class GaudiRun(msgspec.Struct, frozen=True):
    """A Gaudi recipe run: its estimate, or what is missing for one."""

    name: str
    cards: int
    card_type: str
    tokens_from: str = ""
    estimate: RunEstimate | None = None
    missing: str = ""

    def short(self) -> str:
        """`about 3.1–6.6 h (25–53 card-hours)`, or `unknown`."""
        if self.estimate is None:
            return "unknown"
        e = self.estimate
        return (f"about {hours_range(e)} ({e.hours_fast * self.cards:,.0f}–{e.hours_slow * self.cards:,.0f} "
                "card-hours)")

    def said(self) -> str:
        """The short form with how it was reached (MFU, cards, peak, tokens), or what to set for one."""
        if self.estimate is None:
            return f"unknown: {self.missing}"
        e = self.estimate
        return (f"{self.short()} at {mfu_range(e)} MFU of {self.cards} {self.card_type} x {e.peak_tflops:g} TFLOPS "
                f"bf16 (data/gpu_catalog.yaml); tokens: {self.tokens_from}. The MFU range is measured on GPUs, not "
                "on Gaudi [unconfirmed there]")


def peak_tflops(card_type: str, precision: str) -> float | None:
    """The Gaudi card's peak dense TFLOPS in the precision (None: not recorded)."""
    peak = (gpu_catalog.load().gaudi.get(card_type) or {}).get("peakTflops") or {}
    value = peak.get(precision)
    return float(value) if value is not None else None


def gaudi_run(w: MpiJobWorkloadConfig, per_worker: int) -> GaudiRun | None:
    """The Gaudi job's recipe run (`finetune`) on `per_worker` cards a worker; None for anything else."""
    if not w.on_gaudi or w.finetune is None:
        return None
    cards = per_worker * w.workers
    run = GaudiRun(w.name, cards, w.accelerator.type)
    request, precision = workload_request(w), w.deepspeed.precision
    tokens, said = run_tokens(w, cards)  # type: ignore[arg-type]  # reads only finetune, deepspeed and the name
    top = peak_tflops(w.accelerator.type, precision)
    if request is None:
        missing = (f"give workloads.{w.name}.model (name or parameters): the model "
                   f"{w.finetune.model or w.finetune.model_path} cannot be sized")
    elif top is None:
        missing = f"no {precision} peak for {w.accelerator.type} in data/gpu_catalog.yaml"
    elif tokens is None:
        missing = said
    else:
        return msgspec.structs.replace(run, tokens_from=said, estimate=estimate(
            tokens, request, workload_strategy(w), cards, top))
    return msgspec.structs.replace(run, missing=missing)
