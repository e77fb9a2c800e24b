"""Restart semantics for preemptible runs: what the pods and jobs carry so that a run resumes.

The training script saves a DeepSpeed checkpoint when SIGTERM arrives (recipes/smoke_train.py
is the contract) and resumes from the latest on start. The pods must give it the time to save, and the
launching side must start again after a failure:

- terminationGracePeriodSeconds: Kubernetes sends SIGTERM, waits this long, then SIGKILL. On a node
  drain or eviction (GKE upgrades, maintenance, on-demand capacity) and on a whole-job stop (`kubectl delete
  mpijob`, Kueue's preemption or eviction: mpi-operator deletes the launcher's Job and the workers together) the
  whole period is honoured, so every pod of the job gets what its SIGTERM save needs: the planner's estimate of
  the save (planner/recovery.py grace_seconds; 120 s at least, and for a run it cannot size). On a Spot
  VM the node itself goes away after its ~30 s notice, whatever the pod asks for: there only a
  checkpoint that fits the notice is saved, and the periodic checkpoints bound the loss.
- The ranks get that SIGTERM from the workers' preStop hook (recipes/stop_ranks.py): the kubelet sends
  SIGTERM to a container's main process only, sshd on a worker, which exits without signalling the sessions it
  serves, and the kernel then SIGKILLs the rest of the container. The hook runs first: it signals the ranks, waits
  for their save and returns inside the grace period, so the kubelet's own SIGTERM still stops sshd in time.
- A whole-job stop also sends SIGTERM to the MPIJob's launcher. DeepSpeed's runner must not get it: its PDSH
  handler (deepspeed 0.19.8 launcher/runner.py 621-632) runs `pkill -f deepspeed.launcher.launch` on every
  worker, and each per-node launcher then SIGKILLs its ranks 30 s later (launch.py 121-132, 251-270), whatever
  the save needs; killing pdsh also closes the ranks' stdout mid-save. The launcher's trap instead sends every
  worker the preStop hook's own request (stop_ranks.py over ssh) and waits for the runner to end by itself with
  the ranks' status (workloads/mpijob/nvidia.py run_ranks_function). Alone (the launcher's node drained) it
  thereby stops the ranks with a save too, instead of leaving them to run unattended while its next attempt starts.
- The Helm chart's client is a Deployment: Kubernetes restarts its launch after a failure, with its
  own exponential back-off (10 s doubling to 5 minutes), and the relaunch resumes from the checkpoint.
- The MPIJob's launcher restarts OnFailure (mpirun/pdsh fail as soon as a worker is gone); the job's
  backoffLimit bounds the restarts so that a run that can never succeed stops. A final status (exit 2: bad
  arguments or data) is remembered by the NVIDIA launcher, whose later attempts stop at once
  (workloads/mpijob/nvidia.py FINAL_EXIT_STATUSES).
"""

from __future__ import annotations

from typing import Any

from model.types import NodePoolConfig, WorkloadConfig
from planner import recovery as estimate
from recipes import contract
from recipes.contract_programs import STOP_RANKS

# The least grace period of a training pod (Kubernetes' default is 30 s); a sized run gets what its save needs
# (grace_seconds, from the preview's "Preemption recovery" estimate).
TERMINATION_GRACE_SECONDS = estimate.MIN_GRACE_SECONDS
# Restarts of an MPIJob before the operator marks it failed (RunPolicy.backoffLimit).
MPIJOB_BACKOFF_LIMIT = 6

# The workers' preStop hook, shipped with the job's scripts (the MPIJob's ConfigMap, the chart's source ConfigMap).
STOP_RANKS_KEY = "stop_ranks.py"
STOP_RANKS_SCRIPT = contract.HERE / STOP_RANKS_KEY
# What the hook leaves of the grace period for the kubelet's SIGTERM to sshd, before its SIGKILL.
STOP_RANKS_MARGIN_SECONDS = 5


def grace_seconds(w: WorkloadConfig, pool: NodePoolConfig | None = None) -> int:
    """terminationGracePeriodSeconds of every pod of the workload (launcher, workers; the chart's client), on
    `pool` (its local SSDs for tiered saves)."""
    return estimate.workload_grace_seconds(w, pool)


def stop_timeout(grace: int) -> int:
    """How long the hook (and the launcher's stop request) waits for the ranks: the grace less the margin."""
    return max(1, grace - STOP_RANKS_MARGIN_SECONDS)


def stop_ranks_file() -> dict[str, str]:
    """The hook's file under its ConfigMap key."""
    return {STOP_RANKS_KEY: STOP_RANKS_SCRIPT.read_text(encoding="utf-8")}


def stop_ranks_command(scripts_dir: str, grace_seconds: int) -> list[str]:
    """The hook's command line from `scripts_dir` (where the ConfigMap is mounted): it waits for the ranks at most
    the grace period less the margin."""
    return ["python3", f"{scripts_dir}/{STOP_RANKS_KEY}", *STOP_RANKS.argv({"timeout": stop_timeout(grace_seconds)})]


def stop_ranks_hook(scripts_dir: str, grace_seconds: int = TERMINATION_GRACE_SECONDS) -> dict[str, Any]:
    """A worker container's `lifecycle`: preStop runs the hook (stop_ranks_command)."""
    return {"preStop": {"exec": {"command": stop_ranks_command(scripts_dir, grace_seconds)}}}
