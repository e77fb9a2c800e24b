#!/usr/bin/env python3
"""At a reservation's end: take its Kueue flavor's quota away and requeue the jobs admitted to it, so that Kueue
admits them again on their fallback flavor, where they resume from their newest checkpoint.

Run by the CronJob `reservation-end-<pool>` (workloads/reservation_end.py) with its ServiceAccount, in the stack's
image. Each step and the Kueue v0.19.2 / mpi-operator v0.8.0 lines it relies on:

1. Why a requeue is needed at all. Kueue's MPIJob integration reports PodsReady as "the MPIJob has JobRunning=True"
   (kueue pkg/controller/jobs/mpijob/mpijob_controller.go 204-211), and mpi-operator sets JobRunning=False only
   when the MPIJob is suspended (mpi-operator pkg/controller/mpi_job_controller.go 1160-1166): when the
   reservation's nodes go away with the workers, PodsReady stays true, so waitForPodsReady's recoveryTimeout never
   starts, and a lowered quota changes nothing for a Workload already admitted. Suspending the MPIJob by hand does
   not work either: Kueue unsuspends a suspended job whose Workload is admitted (kueue
   pkg/controller/jobframework/reconciler.go 621-626, "start the job if the workload has been admitted").
2. The quota: a JSON patch sets the reservation flavor's `nominalQuota` to 0, after testing the flavor's name at
   its index (a ClusterQueue changed since is left alone: the patch fails, and so does this run). Kueue admits to
   the first flavor that fits in the ClusterQueue's order, so a job requeued now fits only on the next one.
3. The requeue: each Workload of the ClusterQueue admitted to that flavor gets `spec.active: false`. Kueue's
   Workload controller evicts an inactive Workload (reason Deactivated; kueue pkg/controller/core/
   workload_controller.go 671-719); the job reconciler then suspends the MPIJob (reconciler.go 580-585, stopJob),
   mpi-operator suspends the launcher Job and deletes the workers (mpi_job_controller.go 711-724), whose preStop
   hooks save, and once no replica is active Kueue clears the admission (reconciler.go 586-612: Requeued=False,
   reason Deactivated). Deactivation also clears the Workload's requeueState (workload_controller.go 685-697),
   so the PodsReady back-off starts afresh on the new flavor.
4. Reactivation: `spec.active: true`. An active Workload whose Requeued condition is False with reason
   Deactivated is marked Requeued=True, reason Reactivated (workload_controller.go 641-646), and the scheduler
   admits it again, now on the fallback flavor (a ProvisioningRequest on a DWS pool). This program sets it once
   the admission is cleared (or after `--wait-seconds`): set earlier, after the eviction, it still works, because
   the controller reacts when the job reconciler later writes Requeued=False (same lines); set before the
   eviction it would undo the deactivation unseen, which is why the program waits.
   Why not evict another way: a LocalQueue or ClusterQueue `stopPolicy: HoldAndDrain` evicts every admitted job of
   the queue, on every flavor (kueue workload_controller.go 1053-1068 for a LocalQueue); deleting the Workload
   stops the job and makes a new Workload with a new requeue count. Deactivation touches only the jobs on the
   ending flavor.
5. Once: the cron expression has no year (`M H D MON *`), so it fires every year on that date, and on that date in
   the years before the end too. The program acts only from the end (less a minute of clock skew) to
   `--window-seconds` after it; at any other firing it prints so and exits 0.

Idempotent: a Workload it deactivates carries the annotation `deepspeed-stack/reservation-end`; a retry of the Job
(the pod killed between the steps) reactivates those too, and the quota patch sets the same 0 again.

Usage: reservation_end.py --queue Q --flavor F --index I --end RFC3339 --namespaces a,b [--kueue-api ...]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from typing import Any

from recipes.kube_api import JSON_PATCH, Api, ApiError, in_cluster_send

MARK = "deepspeed-stack/reservation-end"  # on the Workloads this program deactivated
SKEW = datetime.timedelta(seconds=60)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--queue", required=True, help="the ClusterQueue")
    p.add_argument("--flavor", required=True, help="the reservation's ResourceFlavor")
    p.add_argument("--index", type=int, required=True, help="its index in the GPU resource group")
    p.add_argument("--end", required=True, help="the reservation's end, RFC 3339 with its zone")
    p.add_argument("--namespaces", required=True, help="comma-separated: where jobs that may use the flavor run")
    p.add_argument("--kueue-api", default="kueue.x-k8s.io/v1beta2")
    p.add_argument("--window-seconds", type=float, default=7 * 86400.0)
    p.add_argument("--wait-seconds", type=float, default=900.0)
    p.add_argument("--poll-seconds", type=float, default=5.0)
    return p.parse_args(argv)


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(datetime.UTC)


def due(now: datetime.datetime, end: datetime.datetime, window: datetime.timedelta) -> bool:
    """Whether this firing is the end's own: not a year before it, not a year after."""
    return end - SKEW <= now < end + window


def quota_patch(flavor: str, index: int) -> list[dict[str, Any]]:
    at = f"/spec/resourceGroups/0/flavors/{index}"
    return [{"op": "test", "path": f"{at}/name", "value": flavor},
            {"op": "replace", "path": f"{at}/resources/0/nominalQuota", "value": 0}]


def on_flavor(wl: dict[str, Any], queue: str, flavor: str) -> bool:
    """Admitted (quota reserved) in `queue` with some PodSet on `flavor` (status.admission, Workload v1beta2)."""
    admission = (wl.get("status") or {}).get("admission") or {}
    if admission.get("clusterQueue") != queue:
        return False
    return any(flavor in (a.get("flavors") or {}).values() for a in admission.get("podSetAssignments") or [])


def _path(api_version: str, namespace: str, name: str = "") -> str:
    return f"/apis/{api_version}/namespaces/{namespace}/workloads" + (f"/{name}" if name else "")


def _workloads(api: Api, api_version: str, namespaces: list[str]) -> list[dict[str, Any]]:
    return [wl for ns in namespaces for wl in api.get(_path(api_version, ns)).get("items", [])]


def _key(wl: dict[str, Any]) -> tuple[str, str]:
    return wl["metadata"]["namespace"], wl["metadata"]["name"]


def requeue(api: Api, args: argparse.Namespace, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> list[tuple[str, str]]:
    """Steps 3 and 4: deactivate the Workloads on the flavor, wait for their admission to clear, reactivate."""
    namespaces = [n for n in args.namespaces.split(",") if n]
    found = _workloads(api, args.kueue_api, namespaces)
    marked = [wl for wl in found if (wl["metadata"].get("annotations") or {}).get(MARK) == args.flavor]
    targets = [wl for wl in found if wl.get("spec", {}).get("active", True) and on_flavor(wl, args.queue, args.flavor)]
    for wl in targets:
        print(f"deactivating workload {'/'.join(_key(wl))} (admitted to {args.flavor})", flush=True)
        api.patch(_path(args.kueue_api, *_key(wl)),
                  {"metadata": {"annotations": {MARK: args.flavor}}, "spec": {"active": False}})
    keys = {_key(wl) for wl in [*marked, *targets]}
    deadline = clock() + args.wait_seconds
    while keys and clock() < deadline:
        admitted = {_key(wl) for wl in _workloads(api, args.kueue_api, namespaces)
                    if (wl.get("status") or {}).get("admission")}
        if not keys & admitted:
            break
        sleep(args.poll_seconds)
    for namespace, name in sorted(keys):
        print(f"reactivating workload {namespace}/{name}: Kueue admits it again on the next flavor", flush=True)
        api.patch(_path(args.kueue_api, namespace, name),
                  {"metadata": {"annotations": {MARK: None}}, "spec": {"active": True}})
    return sorted(keys)


def run(api: Api, args: argparse.Namespace, now: datetime.datetime, **kw: Any) -> int:
    end = parse_time(args.end)
    if not due(now, end, datetime.timedelta(seconds=args.window_seconds)):
        print(f"not the reservation's end ({end:%Y-%m-%d %H:%M} UTC; now {now:%Y-%m-%d %H:%M} UTC): nothing to do",
              flush=True)
        return 0
    api.patch(f"/apis/{args.kueue_api}/clusterqueues/{args.queue}", quota_patch(args.flavor, args.index), JSON_PATCH)
    print(f"clusterqueue {args.queue}: flavor {args.flavor}'s GPU quota is 0", flush=True)
    moved = requeue(api, args, **kw)
    print(f"requeued {len(moved)} workload(s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(Api(in_cluster_send()), args, datetime.datetime.now(datetime.UTC))
    except ApiError as err:  # the Job retries (each step is idempotent); a 422 on the quota: the queue changed
        print(f"reservation-end: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
