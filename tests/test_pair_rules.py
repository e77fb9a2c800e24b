"""The pair-rule table (model/pair_rules.py): what counts as set, keys from the stack's root, the order of the
problems, and each rule family the checks hold as data with a failing input."""

from __future__ import annotations

from typing import Any

from conftest import changed, problems

from checks.capacity import DWS_WITHOUT_RESERVATION, SPOT_ALONE
from checks.platform import PRIVATE_ENDPOINT
from checks.vertex import GCS_FUSE_NEEDS
from checks.workloads import OWN_CLUSTER
from model.config import parse_all
from model.pair_rules import PairRule, pair_problems
from model.types import StackConfig

G = "workloads.gaudi-llm-ds-ft"


def model(stack: str, changes: dict[str, Any] | None = None) -> StackConfig:
    """The typed model, before the rules run (conftest's model() raises on the very problems these tests make)."""
    parsed = parse_all(changed(stack, changes))
    assert parsed.model is not None, parsed.problems
    return parsed.model


def test_a_key_needs_a_key_of_the_stack_root() -> None:
    # The Gaudi example has no `cluster` and no bucket: its workload's GCS FUSE mount breaks both needs, in order.
    m = model("gaudi", {f"{G}.gcsFuse.enabled": True})
    assert [str(p) for p in pair_problems(m, "workloads", GCS_FUSE_NEEDS)] == [
        f"{G}.gcsFuse.enabled: needs the stack's bucket; set storage.enabled: true",
        f"{G}.gcsFuse.enabled: the GCS FUSE CSI driver and Workload Identity are GKE features; this stack has no "
        "`cluster`",
    ]
    assert pair_problems(model("gaudi"), "workloads", GCS_FUSE_NEEDS) == []  # off: neither need applies


def test_the_gcs_fuse_mount_without_a_cluster_is_refused() -> None:
    found = problems("gaudi", {f"{G}.gcsFuse.enabled": True})
    assert (f"{G}.gcsFuse.enabled: the GCS FUSE CSI driver and Workload Identity are GKE features; this stack has "
            "no `cluster`") in found


def test_set_means_not_none_false_or_empty() -> None:
    m = model("dev")
    # dev has a `cluster` block and no kubeconfig or kubernetes.context: nothing is excluded.
    assert pair_problems(m, "", OWN_CLUSTER) == []
    rule = PairRule("cluster", "x", excludes=("kubernetes.context",))
    assert pair_problems(m, "", [rule]) == []  # context None
    assert pair_problems(model("dev", {"kubernetes.context": ""}), "", [rule]) == []
    found = pair_problems(model("dev", {"kubernetes.context": "gke_p_z_c"}), "", OWN_CLUSTER)
    assert [p.path for p in found] == ["kubernetes.context"]
    assert found[0].level == "error"


def test_a_missing_block_is_not_set_and_its_keys_are_not_read() -> None:
    # No `cluster` at all: cluster.privateEndpoint is not set, so the rule does not apply (and reads no attribute).
    assert pair_problems(model("gaudi"), "", PRIVATE_ENDPOINT) == []
    found = pair_problems(model("dev", {"cluster.privateEndpoint": True, "cluster.privateNodes": False}), "",
                          PRIVATE_ENDPOINT)
    assert [str(p) for p in found] == ["cluster.privateEndpoint: a private endpoint needs cluster.privateNodes: true"]


def test_problems_come_pool_by_pool_each_in_the_rules_order() -> None:
    m = model("dws", {"nodePools[0].spot": True, "nodePools[1].spot": True})
    assert [(p.path, p.text.split(" (")[0]) for p in pair_problems(m, "nodePools", SPOT_ALONE)] == [
        ("nodePools[0].spot", "spot VMs cannot be combined with reservation"),
        ("nodePools[1].spot", "spot VMs cannot be combined with flexStart"),
        ("nodePools[1].spot", "spot VMs cannot be combined with queuedProvisioning"),
    ]


def test_excludes_any_of_several_keys_is_one_problem() -> None:
    m = model("dws", {"nodePools[1].reservation": "h100-reservation", "nodePools[1].zones": ["us-central1-a"],
                      "nodePools[1].flexStart": True, "nodePools[1].queuedProvisioning": True})
    assert [p.path for p in pair_problems(m, "nodePools", DWS_WITHOUT_RESERVATION)] == ["nodePools[1].reservation"]
