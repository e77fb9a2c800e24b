"""ComputeClasses: a workload's `pool` then its `fallbackPool` (spot, then on-demand) as GKE's autoscaler sees it.

A preferred node affinity does not give the order: the cluster autoscaler ignores preferred affinity when it
picks a pool to grow (kubernetes/autoscaler#2804). A custom ComputeClass does: its `priorities` name the
preferred pool, then the fallback pool, and `activeMigration.optimizeRulePriority` moves the pods back to the
preferred pool when it has room again. The stack manages the pools, so GKE creates none
(`nodePoolAutoCreation.enabled: false`); both pools carry the class's node label and taint
(components/gpu_node_pool.py) and the workers select the class (workloads/placement.py).

Kueue-queued jobs are not in a class: Kueue picks their pool (the ClusterQueue's flavor order). Which workloads
and pools form a class: model/capacity.py (`workload_chain`); facts and their sources: data/capacity.yaml
`computeClass`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model import capacity
from model.capacity import Chain


def toleration(name: str) -> dict[str, str]:
    facts = capacity.load().compute_class
    return {"key": facts.label_key, "operator": "Equal", "value": name, "effect": facts.taint_effect}


def compute_class(chain: Chain) -> dict[str, Any]:
    """The ComputeClass object: one priority rule per pool, in order; back to the first when it can."""
    facts = capacity.load().compute_class
    return {
        "apiVersion": facts.api_version,
        "kind": facts.kind,
        "metadata": {"name": chain.name, "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
        "spec": {
            "priorities": [{"nodepools": [pool.name]} for pool in chain.pools],
            "activeMigration": {"optimizeRulePriority": True},
            "nodePoolAutoCreation": {"enabled": False},
            "whenUnsatisfiable": facts.when_unsatisfiable,
        },
    }


class ComputeClassesArgs(msgspec.Struct, frozen=True):
    chains: list[Chain]
    # Pool name -> its GKE node pool name (auto-named by Pulumi: `<pool>-<7 characters>`), which the
    # ComputeClass must name; an output, so each class also waits for its pools.
    node_pool_names: dict[str, pulumi.Input[str]]


class ComputeClasses(pulumi.ComponentResource):
    def __init__(self, name: str, args: ComputeClassesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:ComputeClasses", name, None, opts)
        self.classes: dict[str, k8s.apiextensions.CustomResource] = {}
        for chain in args.chains:
            obj = compute_class(chain)
            priorities = [{"nodepools": [args.node_pool_names.get(p.name, p.name)]} for p in chain.pools]
            self.classes[chain.name] = k8s.apiextensions.CustomResource(
                f"{name}-{chain.name}",
                api_version=obj["apiVersion"],
                kind=obj["kind"],
                metadata=k8s.meta.v1.ObjectMetaArgs(name=chain.name, labels=obj["metadata"]["labels"]),
                spec={**obj["spec"], "priorities": priorities},
                # A fixed name: a replacement deletes the old class first.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
        self.register_outputs({"classes": sorted(self.classes)})
