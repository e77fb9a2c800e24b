"""Restart semantics for preemptible runs: what the pods and jobs carry so that a run resumes.

The training script saves a DeepSpeed checkpoint when SIGTERM arrives (workloads/scripts/smoke_test.py
is the contract) and resumes from the latest on start. The pods must give it the time to save, and the
launching side must start again after a failure:

- terminationGracePeriodSeconds: Kubernetes sends SIGTERM, waits this long, then SIGKILL. On a node
  drain or eviction (GKE upgrades, maintenance, on-demand capacity) the whole period is honoured, so it
  is set to what a checkpoint of a large run needs (planner/recovery.py shows the estimate). On a Spot
  VM the node itself goes away after its ~30 s notice, whatever the pod asks for: there only a
  checkpoint that fits the notice is saved, and the periodic checkpoints bound the loss.
- The Helm chart's client is a Deployment: Kubernetes restarts its launch after a failure, with its
  own exponential back-off (10 s doubling to 5 minutes), and the relaunch resumes from the checkpoint.
- The MPIJob's launcher restarts OnFailure (mpirun/pdsh fail as soon as a worker is gone); the job's
  backoffLimit bounds the restarts so that a run that can never succeed stops. A final status (exit 2: bad
  arguments or data) is remembered by the NVIDIA launcher, whose later attempts stop at once
  (workloads/mpijob/nvidia.py FINAL_EXIT_STATUSES).
"""

from __future__ import annotations

# Long enough to write a multi-GB ZeRO checkpoint to the bucket or the NFS claim (see the preview's
# "Preemption recovery" section for the stack's own estimate); Kubernetes' default is 30 s.
TERMINATION_GRACE_SECONDS = 120
# Restarts of an MPIJob before the operator marks it failed (RunPolicy.backoffLimit).
MPIJOB_BACKOFF_LIMIT = 6
