"""Restart semantics for preemptible runs: what the pods and jobs carry so that a run resumes.

The training script saves a DeepSpeed checkpoint when SIGTERM arrives (workloads/scripts/smoke_test.py
is the contract) and resumes from the latest on start. The pods must give it the time to save, and the
launching side must start again after a failure:

- terminationGracePeriodSeconds: Kubernetes sends SIGTERM, waits this long, then SIGKILL. On a node
  drain or eviction (GKE upgrades, maintenance, on-demand capacity) the whole period is honoured, so it
  is set to what a checkpoint of a large run needs (planner/recovery.py shows the estimate). On a Spot
  VM the node itself goes away after its ~30 s notice, whatever the pod asks for: there only a
  checkpoint that fits the notice is saved, and the periodic checkpoints bound the loss.
- The ranks get that SIGTERM from the workers' preStop hook (workloads/scripts/stop_ranks.py): the kubelet sends
  SIGTERM to a container's main process only, sshd on a worker, which exits without signalling the sessions it
  serves, and the kernel then SIGKILLs the rest of the container. The hook runs first: it signals the ranks, waits
  for their save and returns inside the grace period, so the kubelet's own SIGTERM still stops sshd in time.
- The Helm chart's client is a Deployment: Kubernetes restarts its launch after a failure, with its
  own exponential back-off (10 s doubling to 5 minutes), and the relaunch resumes from the checkpoint.
- The MPIJob's launcher restarts OnFailure (mpirun/pdsh fail as soon as a worker is gone); the job's
  backoffLimit bounds the restarts so that a run that can never succeed stops. A final status (exit 2: bad
  arguments or data) is remembered by the NVIDIA launcher, whose later attempts stop at once
  (workloads/mpijob/nvidia.py FINAL_EXIT_STATUSES).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Long enough to write a multi-GB ZeRO checkpoint to the bucket or the NFS claim (see the preview's
# "Preemption recovery" section for the stack's own estimate); Kubernetes' default is 30 s.
TERMINATION_GRACE_SECONDS = 120
# Restarts of an MPIJob before the operator marks it failed (RunPolicy.backoffLimit).
MPIJOB_BACKOFF_LIMIT = 6

# The workers' preStop hook, shipped with the job's scripts (the MPIJob's ConfigMap, the chart's source ConfigMap).
STOP_RANKS_KEY = "stop_ranks.py"
STOP_RANKS_SCRIPT = Path(__file__).resolve().parent / "scripts" / STOP_RANKS_KEY
# What the hook leaves of the grace period for the kubelet's SIGTERM to sshd, before its SIGKILL.
STOP_RANKS_MARGIN_SECONDS = 5


def stop_ranks_file() -> dict[str, str]:
    """The hook's file under its ConfigMap key."""
    return {STOP_RANKS_KEY: STOP_RANKS_SCRIPT.read_text(encoding="utf-8")}


def stop_ranks_hook(scripts_dir: str, grace_seconds: int = TERMINATION_GRACE_SECONDS) -> dict[str, Any]:
    """A worker container's `lifecycle`: preStop runs the hook from `scripts_dir` (where the ConfigMap is mounted)
    and waits for the ranks at most the grace period less the margin."""
    timeout = max(1, grace_seconds - STOP_RANKS_MARGIN_SECONDS)
    return {"preStop": {"exec": {"command": ["python3", f"{scripts_dir}/{STOP_RANKS_KEY}", "--timeout",
                                             str(timeout)]}}}
