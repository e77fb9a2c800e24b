"""Pool capacity options (reservation, flex-start, queued provisioning, spot) as registered under mocks."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DELETE, model, problems, stack_run, stack_yaml

from model import capacity
from planner.capacity_plan import capacity_plan
from preview.engine import RunResult
from preview.sections import capacity as capacity_section
from preview.sections import render_sections

NODE_POOL = "gcp:container/nodePool:NodePool"


@pytest.fixture(scope="module")
def dws() -> RunResult:
    return stack_run("dws")


def test_capacity_facts_pinned() -> None:
    facts = capacity.load()
    # cloud.google.com/kubernetes-engine/docs/concepts/dws: flex-start from 1.32.2-gke.1652000, 7 days at most.
    assert facts.flex_start_min_gke == "1.32.2-gke.1652000"
    assert facts.flex_start_max_run_seconds == 7 * 24 * 3600
    # GKE's queued-provisioning taint and ProvisioningRequest class (FACTS.md section 2 and 3, CT dws example).
    assert facts.queued_taint == "cloud.google.com/gke-queued"
    assert facts.provisioning_class == "queued-provisioning.gke.io"
    # Kueue's chart (kubernetes-sigs/kueue v0.19.2 charts/kueue/README.md), namespace kueue-system.
    assert (facts.kueue_install.chart_repository, facts.kueue_install.chart_version) == (
        "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2")
    assert facts.order == ("reservation", "dws", "on-demand", "spot")


def test_gke_version_parsing() -> None:
    assert capacity.gke_version("1.32.2-gke.1652000") == (1, 32, 2, 1652000)
    assert capacity.gke_version("1.33") == (1, 33, 0, 0)
    assert capacity.gke_version("1.32.2-gke.1651999") < capacity.gke_version("1.32.2-gke.1652000")
    assert capacity.gke_version("latest") is None


def test_reservation_pool_consumes_its_specific_reservation(dws: RunResult) -> None:
    pool = dws.one(NODE_POOL, "h100-reserved").inputs
    assert pool["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
        "values": ["h100-reservation"]}
    assert pool["nodeLocations"] == ["us-central1-a"]
    assert pool["management"] == {"autoRepair": True, "autoUpgrade": True}
    assert "flexStart" not in pool["nodeConfig"] and "queuedProvisioning" not in pool
    assert pool["autoscaling"]["locationPolicy"] == "BALANCED"


def test_queued_provisioning_pool(dws: RunResult) -> None:
    pool = dws.one(NODE_POOL, "h100-dws").inputs
    node = pool["nodeConfig"]
    assert pool["queuedProvisioning"] == {"enabled": True}
    assert node["flexStart"] is True
    assert node["maxRunDuration"] == "86400s"
    assert node["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert node["spot"] is False
    assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 4, "locationPolicy": "ANY"}


def test_cluster_min_master_version(dws: RunResult) -> None:
    assert dws.one("gcp:container/cluster:Cluster").inputs["minMasterVersion"] == "1.33"


def test_plain_pools_keep_their_fields(dev: RunResult) -> None:
    # Nothing new on an existing spot pool: a new node_config field would replace it.
    pool = dev.one(NODE_POOL, "t4").inputs
    assert {"reservationAffinity", "flexStart", "maxRunDuration"}.isdisjoint(pool["nodeConfig"])
    assert "queuedProvisioning" not in pool


# --- Capacity rules (checks/capacity.py): each refused with GKE's reason ---------------------------

def dws_problems(changes: dict) -> list[str]:
    return problems("dws", changes)


def test_dws_stack_has_no_capacity_problem() -> None:
    assert dws_problems({}) == []


def test_spot_with_a_reservation_or_dws_is_refused() -> None:
    found = dws_problems({"nodePools[0].spot": True, "nodePools[1].spot": True})
    assert found == [
        "nodePools[0].spot: spot VMs cannot be combined with reservation (GKE refuses it); use a separate spot "
        "pool, or set spot: false",
        "nodePools[1].spot: spot VMs cannot be combined with flexStart (GKE refuses it); use a separate spot "
        "pool, or set spot: false",
        "nodePools[1].spot: spot VMs cannot be combined with queuedProvisioning (GKE refuses it); use a separate "
        "spot pool, or set spot: false",
    ]


def test_dws_pool_with_a_reservation_is_refused() -> None:
    found = dws_problems({"nodePools[1].reservation": "h100-reservation", "nodePools[1].zones": ["us-central1-a"]})
    assert found == ["nodePools[1].reservation: a flex-start or queued-provisioning pool cannot consume a "
                     "reservation (GKE requires reservation affinity NO_RESERVATION); remove reservation or make a "
                     "separate reservation pool"]


def test_reservation_pool_needs_its_one_zone() -> None:
    assert dws_problems({"nodePools[0].zones": []}) == [
        "nodePools[0].zones: a pool that consumes reservation h100-reservation needs exactly one zone, the "
        "reservation's (e.g. zones: [us-central1-a]); got none (every zone)"]
    assert dws_problems({"nodePools[0].zones": ["us-central1-a", "us-central1-b"]})[0].startswith(
        "nodePools[0].zones: a pool that consumes reservation h100-reservation needs exactly one zone")


def test_gke_version_below_flex_starts_minimum_is_refused() -> None:
    # 1.32.2-gke.1652000: cloud.google.com/kubernetes-engine/docs/concepts/dws (data/capacity.yaml).
    # 1.32 is refused for the image's driver too (its LATEST is R570: tests/test_driver.py); only flex-start's here.
    def flex(changes: dict) -> list[str]:
        return [p for p in dws_problems(changes) if "flex-start" in p]

    assert flex({"cluster.minMasterVersion": "1.32.2-gke.1651000"}) == [
        "cluster.minMasterVersion: 1.32.2-gke.1651000 is below 1.32.2-gke.1652000, the oldest GKE that accepts "
        "flex-start (pool(s) h100-dws); set it to that or newer, e.g. 1.33"]
    assert flex({"cluster.minMasterVersion": "1.32.2-gke.1652000"}) == []
    unset = dws_problems({"cluster.minMasterVersion": DELETE})
    assert any(p.startswith("cluster.minMasterVersion: pool(s) h100-dws use flex-start, which needs GKE "
                            "1.32.2-gke.1652000 or later") for p in unset)


def test_flex_start_longer_than_seven_days_is_refused() -> None:
    assert dws_problems({"nodePools[1].maxRunDuration": "604801s"}) == [
        "nodePools[1].maxRunDuration: 604801s is longer than flex-start's limit of 604800s (7 days); use 604800s "
        "or less"]
    assert dws_problems({"nodePools[1].maxRunDuration": "604800s"}) == []


def test_queued_provisioning_pool_must_scale_from_zero() -> None:
    assert dws_problems({"nodePools[1].minNodes": 1}) == [
        "nodePools[1].minNodes: a queued-provisioning pool must have minNodes 0 (GKE creates its nodes only for "
        "admitted jobs), got 1"]


def test_compact_placement_with_queued_provisioning_on_gpus_is_refused() -> None:
    found = dws_problems({"nodePools[1].compactPlacement": True, "nodePools[1].zones": ["us-central1-a"]})
    assert "nodePools[1].compactPlacement: GKE refuses COMPACT placement on a GPU pool with queued provisioning; " \
           "set compactPlacement: false (Kueue admits the job's nodes together anyway)" in found


def test_compact_placement_with_flex_start_only_on_a3_ultra_a4_h4d() -> None:
    found = dws_problems({"nodePools[1].queuedProvisioning": False, "nodePools[1].compactPlacement": True,
                          "nodePools[1].zones": ["us-central1-a"]})
    assert "nodePools[1].compactPlacement: COMPACT placement with flex-start works only on A3 Ultra, A4 and H4D " \
           "machines, not a3-highgpu-8g; set compactPlacement: false" in found


def test_queued_provisioning_needs_kueue() -> None:
    assert dws_problems({"kueue.install": False}) == [
        "kueue.install: pool(s) h100-dws use queued provisioning, which gets nodes only through Kueue's "
        "ProvisioningRequest; set kueue.install: true"]


def test_kueue_needs_a_gke_cluster() -> None:
    assert problems("gaudi", {"kueue.install": True})[0].startswith(
        "kueue.install: Kueue's queues are built from the stack's GKE pools; it needs `cluster`")


# --- The capacity plan (planner/capacity_plan.py, a summary section) ------------------------------

def test_capacity_plan_output(dws: RunResult) -> None:
    plan = dws.outputs["capacityPlan"]
    assert "order" not in plan  # no one order for every job: finetune wants spot first, pretrain a reservation
    assert plan["queue"] == "deepspeed"
    assert plan["flavors"] == ["h100-reserved", "h100-dws"]  # the ClusterQueue's: only pools queued jobs use
    reserved, dws_pool = plan["gpus"]["nvidia-h100-80gb"]
    # a3-highgpu-8g: $88.49/h on-demand in data/gpu_catalog.yaml; H100 zones of us-central1 from the catalog.
    assert reserved == {"pool": "h100-reserved", "capacity": "reservation", "machineType": "a3-highgpu-8g",
                        "gpusPerNode": 8, "maxNodes": 2, "zones": ["us-central1-a"],
                        "zonesOffering": ["us-central1-a", "us-central1-b", "us-central1-c"],
                        "priceNote": "on-demand rate, billed whether used or not", "reservation": "h100-reservation",
                        "reservationEndTime": "2030-01-01T00:00:00Z", "perNodeHour": 88.49, "atMaxPerHour": 176.98}
    assert (dws_pool["pool"], dws_pool["capacity"], dws_pool["queuedProvisioning"]) == ("h100-dws", "DWS", True)
    assert dws_pool["zones"] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert dws_pool["atMaxPerHour"] == 353.96
    assert [(r["pool"], r["capacity"]) for r in plan["gpus"]["nvidia-l4"]] == [("l4", "on-demand"), ("l4-spot", "spot")]
    assert plan["jobs"] == {
        "pretrain": {"queued": True, "pools": [{"pool": "h100-reserved", "capacity": "reservation"},
                                               {"pool": "h100-dws", "capacity": "DWS"}]},
        "finetune": {"queued": False, "pools": [{"pool": "l4-spot", "capacity": "spot"},
                                                {"pool": "l4", "capacity": "on-demand"}],
                     "computeClass": "deepspeed-l4-spot"}}


def test_capacity_plan_orders_spot_last_and_prices_it_as_spot() -> None:
    t4 = stack_yaml("dev")["deepspeed-stack:nodePools"][0]
    m = model("dev", {"nodePools": [t4, {**t4, "name": "t4-od", "spot": False}]})
    rows = capacity_plan(m)["gpus"]["nvidia-tesla-t4"]
    assert [(r["pool"], r["capacity"]) for r in rows] == [("t4-od", "on-demand"), ("t4", "spot")]
    # n1-standard-8 + 1 T4: on-demand 0.38 + 0.35, spot 0.08 + 0.14 (data/gpu_catalog.yaml).
    assert [r["perNodeHour"] for r in rows] == [0.73, 0.22]


def test_capacity_plan_section_in_the_summary(dws: RunResult) -> None:
    ((title, body),) = render_sections(dws, [capacity_section.section])
    assert title == "Capacity plan"
    # What each job gets, not one order for all (the old text claimed reservation → DWS → on-demand → spot for
    # every job while finetune takes spot first).
    assert "Capacity is obtained in the order" not in body
    assert body.startswith("Kueue admits each queued MPIJob from ClusterQueue `deepspeed` to the first of its "
                           "flavors with free quota (h100-reserved → h100-dws, the order the queued jobs prefer); a "
                           "job whose pods are not all ready within 20m is evicted and requeued, to the same flavor "
                           "while it has free quota (Kueue does not fall through on a stockout). A GKE ComputeClass "
                           "makes the autoscaler grow a job's first pool before its fallback pool")
    assert "| pretrain | h100-reserved (reservation) → h100-dws (DWS) | Kueue, queue `deepspeed` |" in body
    assert "| finetune | l4-spot (spot) → l4 (on-demand) | GKE autoscaler, ComputeClass `deepspeed-l4-spot` (back " \
           "to the first when it has room) |" in body
    assert "| h100-reserved | reservation `h100-reservation` until 2030-01-01T00:00:00Z | us-central1-a | " \
           "us-central1-a, us-central1-b, " \
           "us-central1-c | $88.49 | $176.98 (max 2) | on-demand rate, billed whether used or not |" in body
    assert "| h100-dws | DWS (queued provisioning) |" in body


# --- Spot then on-demand: a GKE ComputeClass (workloads/compute_class.py, placement.py) --------------

COMPUTE_CLASS = "kubernetes:cloud.google.com/v1:ComputeClass"
CLASS_LABEL = "cloud.google.com/compute-class"

# The ComputeClass fields the stack writes, as GKE documents them (no published JSON schema; read 2026-11-23):
# docs.cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass and
# .../concepts/about-custom-compute-classes ("a rule with nodepools takes no other field"; whenUnsatisfiable
# ScaleUpAnyway | DoNotScaleUp; names may not begin with gke or autopilot).
DOCUMENTED = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cloud.google.com/v1"}, "kind": {"const": "ComputeClass"},
        "metadata": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "maxLength": 63,  # also the pools' label value
                     "pattern": "^(?!gke)(?!autopilot)[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
        "spec": {"type": "object", "additionalProperties": False, "properties": {
            "priorities": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["nodepools"],
                "properties": {"nodepools": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}},
            "activeMigration": {"type": "object", "additionalProperties": False, "properties": {
                "optimizeRulePriority": {"type": "boolean"}, "ensureAllDaemonSetPodsRunning": {"type": "boolean"}}},
            "nodePoolAutoCreation": {"type": "object", "properties": {"enabled": {"type": "boolean"}}},
            "whenUnsatisfiable": {"enum": ["ScaleUpAnyway", "DoNotScaleUp"]}}}}}


def test_spot_then_on_demand_is_a_compute_class(dws: RunResult) -> None:
    from conftest import validate_json

    (cls,) = dws.by_type(COMPUTE_CLASS)
    obj = {k: cls.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    validate_json(obj, DOCUMENTED)
    gke_name = {p: dws.one(NODE_POOL, p).physical_name for p in ("l4-spot", "l4")}
    assert obj["metadata"]["name"] == "deepspeed-l4-spot"
    # Spot first, then on-demand (one rule each: inside one rule GKE keeps no order); back to spot when it can;
    # GKE creates no pools of its own; pods wait rather than land on some other machine.
    assert obj["spec"] == {
        "priorities": [{"nodepools": [gke_name["l4-spot"]]}, {"nodepools": [gke_name["l4"]]}],
        "activeMigration": {"optimizeRulePriority": True}, "nodePoolAutoCreation": {"enabled": False},
        "whenUnsatisfiable": "DoNotScaleUp"}
    assert gke_name["l4-spot"].startswith("l4-spot-")  # the auto-named GKE pool, not the config's name
    finetune = dws.one("deepspeed-stack:workloads:DeepSpeedRelease", "finetune")
    assert cls.urn in finetune.dependencies  # the class exists before its pods


def test_helm_job_selects_the_class_not_a_preferred_affinity(dws: RunResult) -> None:
    import json

    from conftest import reference, validate_json

    values = dws.one("kubernetes:helm.sh/v3:Release", "finetune-release").inputs["values"]
    # The chart's client holds no GPU: it runs on the system pool (issue 19.10), outside the class.
    assert values["client"]["nodeSelector"] == {"deepspeed-stack/pool": "system"}
    for role in ("worker",):
        # Only the class: GKE refuses pods that also select a system label the class could set
        # (cloud.google.com/gke-accelerator), and preferred affinity is what the autoscaler ignores (autoscaler#2804).
        assert values[role]["nodeSelector"] == {CLASS_LABEL: "deepspeed-l4-spot"}
        assert "affinity" not in values[role]
        assert {"key": CLASS_LABEL, "operator": "Equal", "value": "deepspeed-l4-spot", "effect": "NoSchedule"} in \
            values[role]["tolerations"]
    validate_json(values, json.loads(reference("bitnami-deepspeed", "values.schema.json").read_text()))


def test_class_pools_carry_the_label_and_taint_gke_requires(dws: RunResult) -> None:
    # GKE: a manually created pool joins a class by node label cloud.google.com/compute-class=NAME and taint
    # cloud.google.com/compute-class=NAME:NoSchedule (about-custom-compute-classes, manual node pools).
    for name in ("l4-spot", "l4"):
        node = dws.one(NODE_POOL, name).inputs["nodeConfig"]
        assert node["labels"][CLASS_LABEL] == "deepspeed-l4-spot"
        assert {"key": CLASS_LABEL, "value": "deepspeed-l4-spot", "effect": "NO_SCHEDULE"} in node["taints"]
    for name in ("h100-reserved", "h100-dws"):
        node = dws.one(NODE_POOL, name).inputs["nodeConfig"]
        assert CLASS_LABEL not in node["labels"]
        assert all(t["key"] != CLASS_LABEL for t in node.get("taints", []))


def test_no_preferred_affinity_anywhere(dws: RunResult) -> None:
    """No pool is chosen by preference (the autoscaler ignores it): the one preferred term is the workers' nodes
    without pending host maintenance (workloads/maintenance.py), which chooses among a pool's nodes."""
    import json

    found: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k.startswith("preferredDuringScheduling"):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(json.dumps([r.inputs for r in dws.resources], default=str)))
    assert found and all(f == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": "cloud.google.com/scheduled-maintenance-time", "operator": "DoesNotExist"}]}}] for f in found)


def test_queued_job_may_use_its_reservation_or_dws(dws: RunResult) -> None:
    import kubernetes_validate

    job = dws.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    # Kueue picks the flavor (and adds its pool to the node selector); the pods only require one of the two.
    assert worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "deepspeed-stack/pool", "operator": "In", "values": ["h100-reserved", "h100-dws"]}]}]}
    # Besides: nodes without pending host maintenance first (workloads/maintenance.py), not a pool preference.
    assert [t["preference"] for t in worker["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]] == [{"matchExpressions": [
            {"key": "cloud.google.com/scheduled-maintenance-time", "operator": "DoesNotExist"}]}]
    assert "deepspeed-stack/pool" not in worker["nodeSelector"] and CLASS_LABEL not in worker["nodeSelector"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": worker}
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    # The workload waits for both of its pools (depending on a component records its children).
    pretrain = dws.one("deepspeed-stack:workloads:TrainingJob", "pretrain")
    for pool in ("h100-reserved", "h100-dws"):
        assert dws.one(NODE_POOL, pool).urn in pretrain.dependencies


def test_compute_class_needs_a_gke_that_has_it() -> None:
    # Custom ComputeClasses on Standard clusters: GKE 1.30.3-gke.1451000 and later (about-custom-compute-classes).
    found = dws_problems({"cluster.minMasterVersion": "1.30.3-gke.1450999", "nodePools[1].flexStart": False,
                          "nodePools[1].queuedProvisioning": False, "nodePools[1].minNodes": 0})
    assert "cluster.minMasterVersion: 1.30.3-gke.1450999 is too old: workload(s) finetune run on `pool` then " \
           "`fallbackPool` through a GKE custom ComputeClass (the autoscaler ignores preferred node affinity), " \
           "which GKE has from 1.30.3-gke.1451000; set it to 1.30.3-gke.1451000 or newer (e.g. 1.33)" in found
    assert not [p for p in dws_problems({"cluster.minMasterVersion": "1.30.3-gke.1451000",
                                         "nodePools[1].flexStart": False, "nodePools[1].queuedProvisioning": False})
                if "ComputeClass" in p]
    unset = dws_problems({"cluster.minMasterVersion": DELETE, "nodePools[1].flexStart": False,
                          "nodePools[1].queuedProvisioning": False})
    assert any(p.startswith("cluster.minMasterVersion: workload(s) finetune run on `pool` then `fallbackPool`")
               for p in unset)


def test_a_class_pool_serves_only_its_class() -> None:
    base = stack_yaml("dws")["deepspeed-stack:workloads"]["finetune"]
    alone = {k: v for k, v in base.items() if k != "fallbackPool"}
    found = dws_problems({"workloads.other": {**alone, "namespace": "other"}})
    assert "workloads.other.pool: pool l4-spot belongs to GKE ComputeClass deepspeed-l4-spot (l4-spot then l4), " \
           "and GKE lets a pool join one class whose taint keeps other pods off it; this workload (without that " \
           "fallbackPool) cannot use it: give it the same pool and fallbackPool, or another pool" in found
    # The same chain twice is one class, and fine.
    assert not [p for p in dws_problems({"workloads.other": {**base, "namespace": "other"}}) if "ComputeClass" in p]
    # The reverse order would put l4 in a second class.
    reverse = dws_problems({"workloads.other": {**base, "namespace": "other", "pool": "l4", "fallbackPool": "l4-spot"}})
    assert any(p.startswith("workloads.other.pool: pool l4 belongs to GKE ComputeClass deepspeed-l4-spot")
               for p in reverse)


def test_fallback_pool_rules() -> None:
    key = "workloads.finetune.fallbackPool"
    assert dws_problems({key: "l4x"}) == [f"{key}: no pool named 'l4x' (pools: h100-reserved, h100-dws, l4-spot, l4)"]
    assert dws_problems({key: "l4-spot"}) == [f"{key}: l4-spot is the workload's `pool` itself; name another pool"]
    assert dws_problems({key: "h100-reserved"}) == [
        f"{key}: h100-reserved has 8 x nvidia-h100-80gb on a3-highgpu-8g, l4-spot 1 x nvidia-l4 on g2-standard-8; "
        "the workers are sized for one shape, so both pools need the same"]
    found = dws_problems({"workloads.finetune.pool": "h100-reserved", key: "h100-dws",
                          "workloads.finetune.resources": {"shmSize": "8Gi"}})
    assert f"{key}: h100-dws has queued provisioning, whose nodes only Kueue-admitted MPIJobs get; use kind: mpijob " \
           "or a fallback pool without queued provisioning" in found


def test_gpu_inventory_names_each_pools_capacity(dws: RunResult, dev: RunResult) -> None:
    from preview.summary import gpu_inventory

    assert {p.pool: p.capacity for p in gpu_inventory(dws)} == {
        "h100-reserved": "reservation h100-reservation", "h100-dws": "DWS queued", "l4-spot": "spot",
        "l4": "on-demand"}
    assert [p.capacity for p in gpu_inventory(dev)] == ["spot"]


def test_kueue_needs_gpu_pools_and_a_recent_mpi_operator() -> None:
    assert "kueue.install: the ClusterQueue's GPU flavors come from `nodePools`, and there are none; add a GPU " \
           "pool or set kueue.install: false" in problems("dev", {"kueue.install": True, "nodePools": []})
    # Kueue's MPIJob integration: mpi-operator v0.8.0 or newer (Kueue docs; data/capacity.yaml).
    # (install: false on the stack's own cluster is refused too, by checks/cluster_wide.py: no CRD there)
    assert "mpiOperator.version: Kueue queues MPIJobs only with mpi-operator v0.8.0 or newer, got v0.7.0" in \
        dws_problems({"mpiOperator.install": False, "mpiOperator.version": "v0.7.0"})


def test_helm_workload_on_a_queued_pool_is_refused() -> None:
    found = dws_problems({"workloads.finetune.pool": "h100-dws", "workloads.finetune.fallbackPool": DELETE})
    assert "workloads.finetune.kind: helm workloads are not queued by Kueue, so nothing would request nodes of " \
           "queued-provisioning pool h100-dws; use kind: mpijob or a pool without queued provisioning" in found


def test_nccl_test_on_a_queued_pool_is_refused() -> None:
    """Issue 31.5: the test's Job is not queued by Kueue, so a queued-provisioning pool never gets nodes for it (the
    rule a helm or serve workload on that pool meets, above); the reserved pool of the same machines is fine."""
    tests = {"bandwidth": {"pools": ["h100-reserved", "h100-dws"], "nodes": 2}}
    found = dws_problems({"ncclTests": tests})
    assert found == [
        "ncclTests.bandwidth.pools[1]: h100-dws has queued provisioning, whose nodes come only for a "
        "ProvisioningRequest Kueue makes for a queued MPIJob; the NCCL test is a plain Job Kueue does not queue, so "
        "nothing would ever request its nodes and it would wait out its deadline. Test a pool of the same machine type "
        "without queued provisioning (h100-reserved): same fabric, same pass line"]
    assert dws_problems({"ncclTests": {"bandwidth": {"pools": ["h100-reserved"], "nodes": 2}}}) == []
