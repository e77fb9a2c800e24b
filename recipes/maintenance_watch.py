#!/usr/bin/env python3
"""Maintenance seen coming: move a worker off its node before the node's host maintenance, with a save.

GPU VMs do not live-migrate: Compute Engine terminates them for host maintenance, and GKE (1.31.1-gke.2008000 and
later, GPU machine types) labels such a node `cloud.google.com/scheduled-maintenance-time=<Unix seconds>` while the
maintenance is scheduled and not yet active (GKE "Monitor maintenance events"). This program runs beside the MPIJob's
launcher (a native sidecar, on the system pool): every `--poll-seconds` it reads each worker pod's node and that
node's label, and once the time is less than `--lead-seconds` away it evicts the worker (the Eviction API, as a
drain does). The kubelet then runs the worker's preStop hook (stop_ranks.py): the ranks save together and exit; the
operator makes the worker again, and the scheduler prefers a node without pending maintenance (the workers' preferred
node affinity: the label absent); the launcher's next attempt resumes from that checkpoint. So the save happens
before the maintenance, within the pod's grace period, rather than at the VM's termination.

`--lead-seconds` is the workers' grace period plus a margin (workloads/maintenance.py). A node is acted on once per
launcher pod (the set lives in the launcher's state emptyDir): a worker made again on the same node (no other node
free) is left to run until the maintenance, which stops it as a node shutdown does.

Least access (workloads/maintenance.py): get on the job's worker pods and create on their eviction subresource
(resourceNames: the operator names workers `<job>-worker-<i>`), get on nodes (a ClusterRole: nodes have no
namespace, and their names are not known before).

Usage: maintenance_watch.py --namespace NS --pods a,b --lead-seconds N [--poll-seconds 60] [--state FILE] [--once]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipes.contract import MAINTENANCE_WATCH
from recipes.kube_api import Api, ApiError, in_cluster_send

LABEL = "cloud.google.com/scheduled-maintenance-time"


def parse_args(argv: list[str]) -> argparse.Namespace:
    return MAINTENANCE_WATCH.parser(description=__doc__.split("\n")[0]).parse_args(argv)


def maintenance_at(node: dict[str, Any]) -> float | None:
    """The node's scheduled maintenance start (Unix seconds), or None (no label, or not a number)."""
    value = ((node.get("metadata") or {}).get("labels") or {}).get(LABEL)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def eviction(namespace: str, pod: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}


class Watcher:
    def __init__(self, api: Api, args: argparse.Namespace, now: Callable[[], float] = time.time,
                 say: Callable[[str], None] = lambda s: print(s, flush=True)):
        self.api, self.args, self.now, self.say = api, args, now, say
        self.state = Path(args.state) if args.state else None
        self.done: set[str] = set(self.state.read_text().split()) if self.state and self.state.exists() else set()

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.api.get(path)
        except ApiError as err:
            if err.status == 404:  # a worker between its deletion and the operator's new one
                return None
            raise

    def round(self) -> list[str]:
        """One look at every worker's node; the workers evicted."""
        evicted = []
        for pod in [p for p in self.args.pods.split(",") if p]:
            obj = self._get(f"/api/v1/namespaces/{self.args.namespace}/pods/{pod}")
            node_name = ((obj or {}).get("spec") or {}).get("nodeName")
            if not node_name or node_name in self.done:
                continue
            node = self._get(f"/api/v1/nodes/{node_name}")
            at = maintenance_at(node or {})
            if at is None:
                continue
            left = at - self.now()
            if left > self.args.lead_seconds:
                continue
            self.say(f"maintenance of node {node_name} in {max(left, 0):.0f} s (label {LABEL}={at:.0f}): evicting "
                     f"worker {pod}, whose preStop hook saves the run; it comes back on a node without pending "
                     "maintenance where there is one")
            try:
                self.api.create(f"/api/v1/namespaces/{self.args.namespace}/pods/{pod}/eviction",
                                eviction(self.args.namespace, pod))
            except ApiError as err:
                if err.status not in (404, 429):  # gone already; 429: a disruption budget says later
                    raise
                self.say(f"eviction of {pod}: {err}; trying again at the next round")
                continue
            self.done.add(node_name)
            evicted.append(pod)
        if evicted and self.state:
            self.state.write_text("\n".join(sorted(self.done)) + "\n")
        return evicted


def main(argv: list[str] | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    watcher = Watcher(Api(in_cluster_send()), args)
    while True:
        try:
            watcher.round()
        except (ApiError, OSError) as err:  # the API server busy or restarting: look again next round
            print(f"maintenance watch: {err}", file=sys.stderr, flush=True)
        if args.once:
            return 0
        sleep(args.poll_seconds)


if __name__ == "__main__":
    sys.exit(main())
