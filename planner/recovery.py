"""How long a checkpoint takes to save, whether it fits a Spot VM's notice, and how often to save.

A ZeRO checkpoint holds what trains: its weights in the training precision plus the fp32 master weights and
Adam's two moments (12 bytes per parameter), partitioned over the ranks: every node writes its share in
parallel. What trains is every parameter, or with LoRA only the adapters (the frozen base is not saved:
transformers 5.19.0's Trainer calls DeepSpeed's save_checkpoint with exclude_frozen_parameters=True for a peft
model, trainer.py _save_optimizer_and_scheduler). A run under the Hugging Face Trainer (finetune.py: `writes_model`)
also writes the model, or the adapter, in the training precision into each checkpoint-N folder (save_model).
The interval follows Young's approximation of the optimum, sqrt(2 x save time x mean time between
interruptions), at least one minute.

`stack_recovery(cfg)` is the `recovery` stack output: the estimate of every training workload with
a `model` block, which the preview's "Preemption recovery" section renders (preview/sections/recovery.py).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from model import capacity, training_speed
from model.fabric import pool_local_ssds
from model.types import DeepSpeedWorkloadConfig, FinetuneWorkloadConfig, NodePoolConfig, StackConfig, WorkloadConfig
from planner.requests import workload_request

# Adam's fp32 master weights, first and second moments.
OPTIMIZER_BYTES_PER_PARAM = 12
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# A Spot VM stops 30 s after its preemption notice; with graceful node shutdown the kubelet gives non-system pods
# the first 15 s of it (GKE > 1.22.8-gke.200), critical system pods the other 15 s, and a pod's
# terminationGracePeriodSeconds above 15 has no effect there. Source: GKE docs, "Spot VMs", "Termination and
# graceful shutdown of Spot VMs" (docs.cloud.google.com/kubernetes-engine/docs/concepts/spot-vms, read
# 2026-11-27). The same page: Standard pools on GKE 1.35.0-gke.1171000+ may extend the window to 120 s through the
# node system configuration (not set by this stack).
SPOT_NOTICE_SECONDS = 30
SPOT_USABLE_SECONDS = 15
# Sustained write bandwidth per node, GB/s. Assumptions for the estimate, not measured here: Cloud
# Storage FUSE with parallel uploads on a GPU VM's NIC, and an NFS share (Filestore basic HDD writes
# 100 MiB/s per share; the in-cluster NFS provisioner is bound by one disk).
WRITE_GBPS = {"gcsfuse": 0.4, "nfs": 0.1}
# Tiered saves (a finetune workload's `localCheckpoints`): write bandwidth per local SSD of the node, GB/s. An
# assumption for the estimate, not measured here: NVMe local SSDs striped into the node's ephemeral storage (A3
# High and Mega: 16 x 375 GB), 0.2 GB/s each for sustained writes.
LOCAL_SSD_WRITE_GBPS = 0.2
# Mean time between interruptions, hours, spot (True) and not: data/training_speed.yaml `interruptions` (stated
# assumptions with their sources: Google publishes no Spot preemption rate; on-demand nodes are interrupted by
# upgrades and maintenance, about weekly), the same figures the run's save interval uses (planner/run_hours.py).
_MTBI = training_speed.load().mean_hours_between_interruptions
MEAN_HOURS_BETWEEN_INTERRUPTIONS = {True: _MTBI[capacity.SPOT], False: _MTBI[capacity.ON_DEMAND]}
MIN_INTERVAL_MINUTES = 1.0
# The pods' terminationGracePeriodSeconds: at least Kubernetes-default-beating 120 s, else what the SIGTERM save
# needs: the step in flight when the notice comes (the ranks agree on it at the step's end; up to a minute
# assumed), then the save with a quarter over the estimate. Every pod of a job gets it, the launcher too: a
# whole-job stop (kubectl delete, Kueue's preemption or eviction) deletes them together and the launcher carries
# the ranks' exit status and log to the end.
MIN_GRACE_SECONDS = 120
STEP_ALLOWANCE_SECONDS = 60
SAVE_HEADROOM = 1.25


class RecoveryPlan(msgspec.Struct, frozen=True):
    checkpoint_gb: float
    save_seconds: float  # to the bucket or the claim: the save itself, or with tiered saves the copy
    fits_spot_notice: bool
    interval_minutes: float
    mean_hours_between_interruptions: float
    local_seconds: float | None = None  # tiered: the save to the node's local SSDs (training waits only for this)

    @property
    def stop_seconds(self) -> float:
        """What a SIGTERM save takes until it is safe: with tiered saves the local save and its copy."""
        return self.save_seconds + (self.local_seconds or 0.0)

    @property
    def stall_seconds(self) -> float:
        """How long training waits at each periodic save."""
        return self.save_seconds if self.local_seconds is None else self.local_seconds

    def lost_minutes(self, notice_seconds: float | None) -> float:
        """The most work an event with `notice_seconds` of time for the save (None: unlimited, the grace period
        fits the save) can lose: none when the stop's save is safe in time, else everything since the newest
        complete checkpoint: an interval, plus the save (or its copy) that is still under way."""
        if notice_seconds is None or self.stop_seconds <= notice_seconds:
            return 0.0
        return self.interval_minutes + self.save_seconds / 60


def checkpoint_bytes(trained: float, precision: str, exported: bool = False) -> float:
    """`trained` parameters' weights and optimizer states; `exported`: the Trainer's copy of the weights too."""
    weights = WEIGHT_BYTES.get(precision, 2)
    return trained * (OPTIMIZER_BYTES_PER_PARAM + weights + (weights if exported else 0))


def plan(trained: float, precision: str, nodes: int, storage: str, spot: bool,
         exported: bool = False, local_ssds: int = 0) -> RecoveryPlan:
    """`trained` parameters in units (not billions: every parameter, or LoRA's adapters); `storage` "gcsfuse" or
    "nfs"; `spot` whether the pool is; `exported` whether the Trainer writes the weights beside DeepSpeed's;
    `local_ssds`: tiered saves to that many local SSDs per node, then copied (0: straight to `storage`). Young's
    interval takes the time training waits at a save: the local one when tiered."""
    size = checkpoint_bytes(trained, precision, exported)
    save = size / (WRITE_GBPS[storage] * 1e9 * max(1, nodes))
    local = size / (LOCAL_SSD_WRITE_GBPS * local_ssds * 1e9 * max(1, nodes)) if local_ssds else None
    mtbi = MEAN_HOURS_BETWEEN_INTERRUPTIONS[spot]
    stall = save if local is None else local
    interval = max(MIN_INTERVAL_MINUTES, math.sqrt(2 * stall * mtbi * 3600) / 60)
    return RecoveryPlan(checkpoint_gb=size / 1e9, save_seconds=save,
                        fits_spot_notice=save + (local or 0.0) <= SPOT_USABLE_SECONDS, interval_minutes=interval,
                        mean_hours_between_interruptions=mtbi, local_seconds=local)


def grace_seconds(save_seconds: float | None) -> int:
    """The pods' grace period for a SIGTERM save of `save_seconds` (None: the run is not sized)."""
    if save_seconds is None:
        return MIN_GRACE_SECONDS
    return max(MIN_GRACE_SECONDS, math.ceil(STEP_ALLOWANCE_SECONDS + SAVE_HEADROOM * save_seconds))


def tiered_ssds(w: WorkloadConfig, pool: NodePoolConfig | None) -> int:
    """The local SSDs a workload's tiered saves go to (0: not tiered, or no pool to say)."""
    tiered = isinstance(w, FinetuneWorkloadConfig) and w.local_checkpoints
    return pool_local_ssds(pool) if tiered and pool is not None else 0


def workload_plan(w: WorkloadConfig, pool: NodePoolConfig | None = None) -> RecoveryPlan | None:
    """The estimate of a sized DeepSpeed training workload on `pool` (Spot or not, its local SSDs for tiered
    saves); None for anything else (not sized, or no run)."""
    request = workload_request(w)
    if request is None or request.mode != "training" or not isinstance(w, DeepSpeedWorkloadConfig):
        return None  # only a DeepSpeed run has a precision and checkpoints to size
    storage = "gcsfuse" if w.gcs_fuse.enabled else "nfs"
    return plan(request.trained_parameters, w.deepspeed.precision, w.workers, storage, bool(pool and pool.spot),
                w.writes_model, tiered_ssds(w, pool))


def workload_grace_seconds(w: WorkloadConfig, pool: NodePoolConfig | None = None) -> int:
    """terminationGracePeriodSeconds of the workload's pods (launcher, workers, chart client): from its SIGTERM
    save (with tiered saves on `pool`'s local SSDs, the local save and its copy)."""
    p = workload_plan(w, pool)
    return grace_seconds(p.stop_seconds if p else None)


def stack_recovery(cfg: StackConfig) -> dict[str, dict[str, Any]]:
    """The `recovery` output: per sized training workload (a `model` block, or a kind sized from its own keys),
    its checkpoint, the time to save it, the pods' grace period (grace_seconds: what a drain or a whole-job stop
    gives the SIGTERM save) and whether the save fits it and the Spot notice, and the save interval in minutes.
    Workloads whose model cannot be sized are left out."""
    pools = {p.name: p for p in cfg.node_pools}
    out: dict[str, dict[str, Any]] = {}
    for name, w in sorted(cfg.workloads.items()):
        pool = pools.get(w.pool or "")
        spot = bool(pool and pool.spot)
        p = workload_plan(w, pool)
        if p is None or not isinstance(w, DeepSpeedWorkloadConfig):
            continue
        storage = "gcsfuse" if w.gcs_fuse.enabled else "nfs"
        grace = grace_seconds(p.stop_seconds)
        out[name] = {"checkpointGb": p.checkpoint_gb, "saveSeconds": p.save_seconds, "storage": storage,
                     "spot": spot, "fitsSpotNotice": p.fits_spot_notice, "graceSeconds": grace,
                     "fitsGracePeriod": p.stop_seconds <= grace, "saveEveryMinutes": p.interval_minutes,
                     "meanHoursBetweenInterruptions": p.mean_hours_between_interruptions,
                     "localSaveSeconds": p.local_seconds, "localSsds": tiered_ssds(w, pool),
                     # The most work each event can lose, in minutes: a drain or a whole-job stop gives the grace
                     # period; a Spot VM the 15 s of its notice; a node failure no time at all.
                     "lostMinutes": {"drain": p.lost_minutes(grace), "spot": p.lost_minutes(SPOT_USABLE_SECONDS),
                                     "nodeFailure": p.lost_minutes(0.0)}}
    return out
