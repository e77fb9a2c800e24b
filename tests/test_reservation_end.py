"""Outliving a reservation (issue 31 item 4): the pool's `reservationEndTime` checked against a fixed "now", the
Kueue objects that move a requeued job to its fallback flavor (validated against Kueue's v0.19.2 CRDs and
Kubernetes' schemas), and the preview's word on a finetune run that goes past the end."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from conftest import DELETE, changed, config_model, model, problems
from test_kueue import crd_problems

from model import reservation
from planner import cost, cost_markdown, spill
from workloads import kueue, reservation_end

NOW = "2026-11-27T12:00:00Z"
UTC = datetime.UTC


@pytest.fixture(autouse=True)
def fixed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reservation.NOW_ENV, NOW)


# --- the end time ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-04T00:00:00Z", datetime.datetime(2026, 12, 4, tzinfo=UTC)),
    ("2026-12-04T00:00Z", datetime.datetime(2026, 12, 4, tzinfo=UTC)),  # to the minute, as people write it
    ("2026-12-04T09:30:00+09:00", datetime.datetime(2026, 12, 4, 0, 30, tzinfo=UTC)),
])
def test_end_time_forms(text: str, expected: datetime.datetime) -> None:
    assert reservation.parse_time(text) == expected


@pytest.mark.parametrize("text", ["2026-12-04", "2026-12-04T00:00:00", "2026-13-04T00:00:00Z", "next friday"])
def test_end_time_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="is not an RFC 3339 time with its zone"):
        reservation.parse_time(text)


def test_the_dws_example_loads_with_its_reservation_end() -> None:
    pool = model("dws").pool("h100-reserved")
    assert pool is not None and pool.reservation_end_time == datetime.datetime(2030, 1, 1, tzinfo=UTC)
    assert pool.reservation_end_time.utcoffset() == datetime.timedelta(0)  # aware, in UTC
    assert pool.reservation_end_text == "2030-01-01T00:00:00Z"  # as written: what the stack writes back out


def test_end_time_parsed_once_where_the_model_is_built() -> None:
    # An offset and no seconds: the model holds the instant in UTC, and the text as the user wrote it.
    pool = model("dws", {"nodePools[0].reservationEndTime": "2030-06-15T09:30+02:00"}).pool("h100-reserved")
    assert pool is not None and pool.reservation_end_time == datetime.datetime(2030, 6, 15, 7, 30, tzinfo=UTC)
    assert pool.reservation_end_text == "2030-06-15T09:30+02:00"


@pytest.mark.parametrize(("text", "why"), [
    ("2030-13-01T00:00:00Z", "month must be in 1..12"),
    ("2030-02-30T00:00:00Z", "day is out of range for month"),
    ("2030-01-32T00:00:00Z", "day is out of range for month"),
    ("2030-01-01T24:00:00Z", "hour must be in 0..23"),
])
def test_a_time_that_is_not_real_is_refused_at_its_key_with_every_other_problem(text: str, why: str) -> None:
    # Of the form, but no time: refused where the model is built, beside the schema's problem on another key and
    # a rule's on a third, all in one run (before, the planner swallowed it and the check alone said so).
    found = problems("dws", {"nodePools[0].reservationEndTime": text, "nodePools[1].maxNodes": 0,
                             "nodePools[2].reservationEndTime": "2030-01-01T00:00:00Z"})
    assert found == [
        "nodePools[1].maxNodes: must be at least 1, got 0",
        f"nodePools[0].reservationEndTime: {text!r} is not an RFC 3339 time with its zone, such as "
        f"2026-12-04T00:00:00Z ({why})",
        "nodePools[2].reservationEndTime: only a pool that consumes a reservation (`reservation`) ends with it; set "
        "reservation or remove this key"]


def test_end_time_in_the_past_is_refused() -> None:
    found = problems("dws", {"nodePools[0].reservationEndTime": "2026-11-27T11:59:00Z"})
    assert found == ["nodePools[0].reservationEndTime: 2026-11-27 11:59 UTC is past (now 2026-11-27 12:00 UTC): "
                     "reservation h100-reservation's nodes are gone; give the reservation's new end, or move its "
                     "workloads to their fallbackPool"]


def test_end_time_malformed_is_refused() -> None:
    found = problems("dws", {"nodePools[0].reservationEndTime": "2026-12-04 midnight"})
    assert found == ["nodePools[0].reservationEndTime: '2026-12-04 midnight' is not an RFC 3339 time with its zone, "
                     "such as 2026-12-04T00:00:00Z"]


def test_end_time_without_a_reservation_is_refused() -> None:
    found = problems("dws", {"nodePools[2].reservationEndTime": "2030-01-01T00:00:00Z"})
    assert found == ["nodePools[2].reservationEndTime: only a pool that consumes a reservation (`reservation`) ends "
                     "with it; set reservation or remove this key"]


def test_workload_on_an_ending_reservation_without_a_fallback_is_refused() -> None:
    found = problems("dws", {"workloads.pretrain.fallbackPool": DELETE})
    assert found == ["workloads.pretrain.fallbackPool: pool h100-reserved's reservation ends at 2030-01-01T00:00:00Z; "
                     "name a pool of the same shape (e.g. h100-dws) that the job continues on from its newest "
                     "checkpoint when the reservation's nodes go away"]


# --- Kueue: the reservation's flavor first, the fallback next, and the quota taken away at the end ------------------

def _objects(m: Any) -> list[dict[str, Any]]:
    pools = kueue.flavor_pools(m)
    where = kueue.end_namespaces(m, pools)
    return [*kueue.cluster_objects(m.kueue, pools),
            *reservation_end.objects(m.kueue.queue_name, pools, where, "registry.example/deepspeed@sha256:" + "0" * 64,
                                     kueue.end_waits(m, pools)),
            *(o for ns in sorted({n for v in where.values() for n in v}) for o in reservation_end.namespace_access(ns))]


def _apply(patch: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
    """RFC 6902 `test` and `replace` on a copy, as the API server applies kubectl's --type=json patch."""
    import copy

    out = copy.deepcopy(obj)
    for op in patch:
        *parents, last = [int(p) if p.isdigit() else p for p in op["path"].lstrip("/").split("/")]
        node = out
        for p in parents:
            node = node[p]
        if op["op"] == "test":
            assert node[last] == op["value"], f"test failed at {op['path']}"
        else:
            node[last] = op["value"]
    return out


def _first_fit(queue: dict[str, Any], gpus: int) -> str | None:
    """Kueue's flavor choice for a job alone in its ClusterQueue: the first GPU flavor, in order, whose nominal
    quota holds the request (data/capacity.yaml kueue.reservationEnd)."""
    for flavor in queue["spec"]["resourceGroups"][0]["flavors"]:
        if flavor["resources"][0]["nominalQuota"] >= gpus:
            return flavor["name"]
    return None


def test_cluster_queue_tries_the_reservation_then_its_fallback() -> None:
    objects = _objects(model("dws"))
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    assert crd_problems(queue) == []
    flavors = [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]]
    assert flavors[:2] == ["h100-reserved", "h100-dws"]
    # Kueue's field names (CRD clusterqueues v1beta2): go on to the next flavor rather than borrow or preempt.
    assert queue["spec"]["flavorFungibility"] == {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"}


def _args(cron: dict[str, Any]) -> list[str]:
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_at_the_end_the_requeued_job_fits_only_on_the_fallback() -> None:
    objects = _objects(model("dws"))
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    (cron,) = [o for o in objects if o["kind"] == "CronJob"]
    assert cron["spec"]["schedule"] == "0 0 1 1 *" and cron["spec"]["timeZone"] == "Etc/UTC"  # 2030-01-01T00:00Z
    args = _args(cron)
    # The program, the ClusterQueue, the flavor at index 0, the end, and pretrain's namespace.
    assert args == ["/opt/deepspeed-stack/reservation-end/reservation_end.py", "--queue", "deepspeed",
                    "--flavor", "h100-reserved", "--index", "0", "--end", "2030-01-01T00:00:00Z",
                    "--namespaces", "pretrain", "--kueue-api", "kueue.x-k8s.io/v1beta2",
                    # pretrain's pods' grace period (unsized: the least, 120 s) and 300 s for Kueue and the operator.
                    "--wait-seconds", "420"]
    from test_reservation_requeue import program

    patch = program().quota_patch("h100-reserved", 0)
    # 2 workers x 8 H100s: the reservation's flavor before the end, the DWS flavor after it.
    assert _first_fit(queue, 16) == "h100-reserved"
    after = _apply(patch, queue)
    assert _first_fit(after, 16) == "h100-dws"
    assert crd_problems(after) == []
    # A ClusterQueue whose flavors moved since is left as it is: the patch's test fails first.
    moved = _apply([{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/name", "value": "other"}], queue)
    with pytest.raises(AssertionError, match="test failed"):
        _apply(patch, moved)


def test_the_wait_follows_the_longest_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kueue clears an evicted job's admission once its pods are gone, within their grace period (from the save)."""
    from workloads import recovery

    m = model("dws")
    pool = m.pool("h100-reserved")
    assert pool is not None and reservation_end.wait_seconds(m, pool) == 120 + 300
    monkeypatch.setattr(recovery, "grace_seconds", lambda w: 943)  # the 70B run: a 706 s save
    assert reservation_end.wait_seconds(m, pool) == 943 + 300


def test_a_schedule_with_seconds_fires_at_the_next_minute() -> None:
    # Cron has no seconds: firing at 00:00 for an end at 00:00:30 would be 30 s early, and the program waits for
    # the end itself (test_reservation_requeue.py), so it would do nothing.
    def at(*when: int, hours: int = 0) -> datetime.datetime:
        return datetime.datetime(*when, tzinfo=datetime.timezone(datetime.timedelta(hours=hours)))

    assert reservation_end.cron_schedule(at(2030, 1, 1, 0, 0, 30)) == "1 0 1 1 *"
    assert reservation_end.cron_schedule(at(2030, 12, 31, 23, 59, 1)) == "0 0 1 1 *"
    assert reservation_end.cron_schedule(at(2030, 6, 15, 9, 30, hours=2)) == "30 7 15 6 *"


def pod_uid(cron: dict) -> int:
    return cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_reservation_end_objects_are_valid_kubernetes() -> None:
    import kubernetes_validate

    objects = [o for o in _objects(model("dws")) if not o["apiVersion"].startswith("kueue.")]
    assert [o["kind"] for o in objects] == ["ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                            "CronJob", "Role", "RoleBinding"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33.0", strict=True)
    (cron,) = [o for o in objects if o["kind"] == "CronJob"]
    # checkov's checks it cannot pass, skipped on it with their reasons: the token the program needs, and the
    # stack image's one user, 1001 (CKV_K8S_40 failed make checkov-all on the dws stack without it).
    assert sorted(v.split("=")[0] for v in cron["metadata"]["annotations"].values()) == ["CKV_K8S_38", "CKV_K8S_40"]
    assert pod_uid(cron) == 1001
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("registry.example/deepspeed@sha256:")  # the stack's image, by digest
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert sorted(config["data"]) == ["kube_api.py", "recipes.py", "reservation_end.py"]


def test_the_requeue_access_is_the_minimum() -> None:
    """Patch on the one ClusterQueue (a JSON patch needs no read first); list and patch on Workloads in the one
    namespace whose job may use the reservation. A Workload's name carries a hash of its job's UID, unknown before
    the job exists (Kueue workload_names.go), so no resourceNames there; waiting lists again: no get, no watch."""
    objects = _objects(model("dws"))
    rules = {(o["kind"], o["metadata"].get("namespace")): o["rules"] for o in objects if "rules" in o}
    assert rules == {
        ("ClusterRole", None): [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"],
                                 "resourceNames": ["deepspeed"], "verbs": ["patch"]}],
        ("Role", "pretrain"): [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
                                "verbs": ["list", "patch"]}],
    }
    bindings = [o for o in objects if o["kind"].endswith("Binding")]
    assert {(b["kind"], b["metadata"].get("namespace")) for b in bindings} == {
        ("ClusterRoleBinding", None), ("RoleBinding", "pretrain")}
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "reservation-end", "namespace": "kueue-system"}]


def test_without_an_end_nothing_changes() -> None:
    m = model("dws", {"nodePools[0].reservationEndTime": DELETE})
    objects = _objects(m)
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    assert "flavorFungibility" not in queue["spec"]
    assert not [o for o in objects if o["kind"] == "CronJob"]


# --- what spills over, and the preview's word on it -----------------------------------------------------------------

def test_spill_by_hand() -> None:
    start = datetime.datetime(2026, 11, 27, 12, tzinfo=UTC)
    end = datetime.datetime(2026, 12, 4, tzinfo=UTC)  # 6.5 days later: 156 h
    s = spill.spill(120.0, 200.0, start, end)
    assert (s.hours_left, s.fast, s.slow, s.outlives) == (156.0, 0.0, 44.0, True)
    assert s.cost(88.49) == (0.0, 44.0 * 88.49)  # $3,893.56 at the slow end
    assert not spill.spill(10.0, 20.0, start, end).outlives
    assert spill.spill(10.0, 20.0, end, start).hours_left == 0.0  # already over: the whole run spills


def _finetune_on_a_reservation(end: str) -> dict[str, Any]:
    """The finetune stack's l4x4 pool as a reservation that ends at `end`, with a spot pool of its shape to go on."""
    config = changed("finetune", {"nodePools[0].spot": False, "nodePools[0].reservation": "l4-reservation",
                                  "nodePools[0].reservationEndTime": end, "workloads.tune.fallbackPool": "l4x4-spot",
                                  "cluster.minMasterVersion": "1.33"})
    pools = config["deepspeed-stack:nodePools"]
    pools.append({**pools[0], "name": "l4x4-spot", "spot": True})
    del pools[-1]["reservation"], pools[-1]["reservationEndTime"]
    return config


def test_preview_says_when_the_run_goes_past_the_end() -> None:
    m = config_model(_finetune_on_a_reservation("2026-11-27T13:00:00Z"))  # 1 h after NOW
    costs = cost.stack_costs(m)
    run = costs["runs"]["tune"]
    res = run["reservation"]
    assert (res["name"], res["endTime"], res["from"], res["hoursLeft"]) == (
        "l4-reservation", "2026-11-27 13:00 UTC", "2026-11-27 12:00 UTC", 1.0)
    hours = run["hours"]
    # the run in all (training, saves, data step) less the hour left, none where it ends in time (the fast end)
    assert res["pastEnd"] == {"fast": max(0.0, round(hours["fast"] - 1, 3)), "slow": round(hours["slow"] - 1, 3)}
    assert res["pastEnd"]["slow"] > 0
    # The hours past the end at the spot pool's $/h while it trains (its own pool at min nodes, as it pays).
    assert res["fallback"]["pool"] == "l4x4-spot" and res["fallback"]["perHour"] == run["perHour"]["spot"]
    text = cost_markdown.costs_markdown(costs)
    assert "Reservation `l4-reservation` of pool l4x4 ends 2026-11-27 13:00 UTC, 1.0 h after 2026-11-27 12:00 UTC " \
           "(now): **the run goes past it** by" in text
    assert "GKE's ComputeClass grows fallbackPool l4x4-spot instead (spot), where it continues from its newest " \
           "checkpoint without a redeploy" in text


def test_preview_says_when_the_run_ends_in_time() -> None:
    m = config_model(_finetune_on_a_reservation("2030-01-01T00:00:00Z"))
    text = cost_markdown.costs_markdown(cost.stack_costs(m))
    assert "ends 2030-01-01 00:00 UTC" in text and "the run ends before it, even at its slow end" in text


def test_capacity_plan_names_the_end() -> None:
    from planner.capacity_plan import capacity_markdown, capacity_plan

    text = capacity_markdown(capacity_plan(model("dws")))
    assert "| h100-reserved | reservation `h100-reservation` until 2030-01-01T00:00:00Z |" in text
    assert "| pretrain | h100-reserved (reservation) → h100-dws (DWS) | Kueue, queue `deepspeed` |" in text


# --- reserved nodes no workload uses ----------------------------------------------------------------------------------

def test_idle_reserved_nodes_are_warned_with_their_cost() -> None:
    import checks

    # pretrain's 2 workers on a pool of 4 reserved a3-highgpu-8g nodes: 2 idle, at $88.49 each (data/gpu_catalog.yaml).
    found = [w for w in checks.warnings(model("dws", {"nodePools[0].maxNodes": 4})) if "idle" in w]
    assert found == ["nodePools[0].maxNodes: pool h100-reserved reserves 4 nodes of reservation h100-reservation and "
                     "its workloads use 2 (pretrain: 2): 2 reserved nodes sit idle, billed at the on-demand rate "
                     "whether used or not: $176.98/h (2 x $88.49, data/gpu_catalog.yaml 2026-11-21). Give them work "
                     "(more workers) or shrink the reservation and maxNodes to 2"]
    assert not [w for w in checks.warnings(model("dws")) if "idle" in w]  # 2 of 2 used


def test_idle_reserved_nodes_over_a_timed_run() -> None:
    import checks

    config = _finetune_on_a_reservation("2030-01-01T00:00:00Z")
    config["deepspeed-stack:nodePools"][0]["maxNodes"] = 3
    m = config_model(config)
    (found,) = [w for w in checks.warnings(m) if "idle" in w]
    hours = cost.stack_costs(m)["runs"]["tune"]["hours"]
    # 1 idle g2 L4x4 node at its on-demand $/h, over the run's fast and slow hours.
    node = 4.0  # data/gpu_catalog.yaml g2-standard-48 (4 x L4), on-demand
    assert found.startswith("nodePools[0].maxNodes: pool l4x4 reserves 3 nodes of reservation l4-reservation and its "
                            "workloads use 2 (tune: 2): 1 reserved node sits idle")
    assert f"${node:,.2f}/h (1 x ${node:,.2f}" in found
    assert f"${node * hours['fast']:,.0f}–${node * hours['slow']:,.0f} over run tune" in found
