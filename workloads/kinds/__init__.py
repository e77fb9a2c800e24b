"""The workload kinds: one module each, listed here by hand (no discovery, no registration on import).

`__main__.py` builds each workload with its kind's builder and checks/ runs each kind's rules; nothing else names
kinds. Adding a kind: its typed class in the model/workload_*.py module of its family (and in WORKLOAD_TYPES,
model/workload_types.py) and its branch in model/schema.yaml, a module here that builds its `Kind` (config, rules,
builder; see kind.py), and a line below.
"""

from __future__ import annotations

from model.types import WorkloadConfig
from workloads.kinds import finetune, helm, mpijob, serve, tensorboard
from workloads.kinds.kind import Built, Kind, Platform

KINDS: dict[str, Kind] = {
    "helm": helm.KIND,
    "mpijob": mpijob.KIND,
    "finetune": finetune.KIND,
    "serve": serve.KIND,
    "tensorboard": tensorboard.KIND,
}


def kind_of(w: WorkloadConfig) -> Kind:
    return KINDS[w.kind]


__all__ = ["KINDS", "Built", "Kind", "Platform", "kind_of"]
