"""What a stack bills besides its node pools: each Filestore claim, from creation to deletion (so part of its floor),
and the Vertex AI CustomJob while it runs (with its run in all, planner/vertex_run.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from model import catalog as gpu_catalog
from model import gke_drivers
from model.types import StackConfig, VertexConfig
from planner import vertex_run

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")  # the schema's `bytes` form
_UNIT = {None: 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def gib(quantity: str) -> float | None:
    """A Kubernetes quantity (the schema's `bytes` form: 1Ti, 500G, 1024) in GiB; None for another form."""
    match = _QUANTITY.match(quantity)
    return float(match.group(1)) * _UNIT[match.group(2)] / 2**30 if match else None


def filestore_costs(cfg: StackConfig, cat: gpu_catalog.Catalog) -> dict[str, Any] | None:
    """Each claim on a Filestore class, billed at its size or the tier's minimum on the cluster's GKE version,
    whichever is larger, from creation to deletion (so part of the floor). None when no claim is on Filestore."""
    if cfg.cluster is None:
        return None
    fs, claims = cat.filestore, []
    minor = gke_drivers.cluster_minor(cfg.cluster)  # GKE's CSI driver provisions smaller Basic HDD from 1.33
    for name, w in cfg.workloads.items():
        claim = w.claim  # the kinds whose builder creates a `storage` claim on the stack's cluster
        tier = fs.tier(claim.storage_class) if claim is not None else None
        if claim is None or tier is None:
            continue
        size = gib(claim.size)
        billed = math.ceil(max(size or 0.0, tier.min_gib_on(minor)))
        price = None if tier.per_gib_hour is None else round(billed * tier.per_gib_hour, 4)
        claims.append({"workload": name, "claim": claim.claim_name, "storageClass": claim.storage_class,
                       "tier": tier.name, "requested": claim.size, "billedGiB": billed, "perHour": price})
    if not claims:
        return None
    return {"claims": claims, "perHour": round(sum(c["perHour"] or 0.0 for c in claims), 4),
            "unpriced": [c["workload"] for c in claims if c["perHour"] is None],
            "priceSource": f"data/gpu_catalog.yaml filestore ({fs.source}, {fs.date})"}


def vertex_per_hour(v: VertexConfig, cat: gpu_catalog.Catalog) -> float | None:
    """Vertex's $/h for every replica while the job runs: (machine + GPUs) x markup x replicas; None unpriced."""
    node = cat.machine_hour(v.machine_type, v.spot, v.gpu.type, v.gpu.count)
    return None if node is None else round(node * cat.vertex.markup * (1 + v.workers), 4)


def vertex_cost(cfg: StackConfig, cat: gpu_catalog.Catalog) -> dict[str, Any] | None:
    """The Vertex AI CustomJob while it runs: (machine + GPUs) x replicas (the primary and `workers`) at
    Vertex's training rate, modelled as the Compute Engine price x the catalog's markup."""
    v = cfg.vertex
    if not v.enabled:
        return None
    replicas = 1 + v.workers
    out: dict[str, Any] = {"machineType": v.machine_type, "accelerator": f"{v.gpu.count} x {v.gpu.type}",
                           "replicas": replicas, "spot": v.spot, "markup": cat.vertex.markup,
                           "markupConfirmed": cat.vertex.confirmed,
                           "priceSource": f"data/gpu_catalog.yaml vertexTraining ({cat.vertex.source}, "
                                          f"{cat.vertex.date}) and the machine and GPU prices"}
    node = cat.machine_hour(v.machine_type, v.spot, v.gpu.type, v.gpu.count)
    if node is None:
        out["price"] = "unknown: add the machine type and GPU to data/gpu_catalog.yaml"
    else:
        out["perReplicaPerHour"] = round(node * cat.vertex.markup, 4)
        out["perHour"] = round(node * cat.vertex.markup * replicas, 4)
    if (run := vertex_run.vertex_run(v, out.get("perHour"), cat)) is not None:
        out["run"] = run
    return out
