"""The likelihood task's metric for lm-eval (evaluate_task.py's task file names these by `!function`): the mean
log-likelihood per reference token over all records (the sum of the references' log-likelihoods over the sum of
their tokens), so long references weigh by their length, as a per-token loss does. Standard library only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def process_results(doc: Mapping[str, Any], results: Sequence[tuple[float, bool]]) -> dict[str, tuple[float, int]]:
    """lm-eval's per-document result: (log-likelihood of the continuation, its token count)."""
    loglikelihood, _greedy = results[0]
    return {"loglikelihood": (float(loglikelihood), int(doc["tokens"]))}


def per_token(items: Sequence[tuple[float, int]]) -> float:
    """The aggregation: nats per reference token (higher is better; 0 would be certainty)."""
    tokens = sum(n for _, n in items)
    return sum(ll for ll, _ in items) / tokens if tokens else float("nan")
