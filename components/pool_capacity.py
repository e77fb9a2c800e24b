"""The node-pool fields that decide where a GPU pool's nodes come from (pure helpers of GpuNodePool).

GKE's rules for each option (checked at preview in checks/capacity.py), as the pool sets them:
- specific reservation: `reservation_affinity` SPECIFIC_RESERVATION on the reservation's name, explicit zones;
- flex-start: `flex_start`, optional `max_run_duration`, auto-repair off, NO_RESERVATION, location policy ANY;
- queued provisioning: as flex-start, plus `queued_provisioning`; the pool scales from 0 on ProvisioningRequests;
- spot: `spot`, location policy ANY (spot capacity comes and goes per zone).
Sources: data/capacity.yaml (GKE DWS docs, cluster-toolkit gke-node-pool).
"""

from __future__ import annotations

import pulumi_gcp as gcp

from model import capacity
from model.types import NodePoolConfig


def reservation_affinity(cfg: NodePoolConfig) -> gcp.container.NodePoolNodeConfigReservationAffinityArgs | None:
    """SPECIFIC for a named reservation; NO_RESERVATION for DWS (GKE refuses flex-start that may consume one);
    unset otherwise, so existing pools keep GKE's default and are not replaced."""
    facts = capacity.load()
    if cfg.reservation:
        return gcp.container.NodePoolNodeConfigReservationAffinityArgs(
            consume_reservation_type=facts.reservation_consume_type, key=facts.reservation_key,
            values=[cfg.reservation])
    if capacity.is_dws(cfg):
        return gcp.container.NodePoolNodeConfigReservationAffinityArgs(consume_reservation_type="NO_RESERVATION")
    return None


def location_policy(cfg: NodePoolConfig) -> str:
    # Spot and DWS capacity is found wherever a zone has it; ANY takes it there instead of balancing zones.
    return "ANY" if cfg.spot or capacity.is_dws(cfg) else "BALANCED"


def auto_repair(cfg: NodePoolConfig) -> bool:
    # GKE requires auto-repair off for flex-start and queued provisioning: a repaired node would be a new VM
    # outside the capacity request.
    return not capacity.is_dws(cfg)


def flex_start(cfg: NodePoolConfig) -> bool | None:
    # Unset rather than False when off: existing pools see no new field. Queued provisioning is normally
    # combined with flex-start (CT example), which the stack leaves to the config (`flexStart: true`).
    return True if cfg.flex_start else None


def queued_provisioning(cfg: NodePoolConfig) -> gcp.container.NodePoolQueuedProvisioningArgs | None:
    return gcp.container.NodePoolQueuedProvisioningArgs(enabled=True) if cfg.queued_provisioning else None
