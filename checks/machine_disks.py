"""Rules for a pool's disks against its machine shape (facts: `machineDisks` in data/gpu_catalog.yaml)."""

from __future__ import annotations

from checks.common import Check, at, or_list
from model import catalog
from model.machine_disks import MachineDisks, for_machine
from model.problems import Problem
from model.types import NodePoolConfig, StackConfig


def _facts(pool: NodePoolConfig) -> MachineDisks | None:
    """The shape's disk facts, when the pool's GPU and machine type agree (otherwise that is the problem to fix,
    and a disk problem on top would only be noise)."""
    if catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count) is None:
        return None
    return for_machine(pool.machine_type)


def check_local_ssd_count(m: StackConfig) -> list[Problem]:
    """Compute Engine takes only certain local SSD counts per machine shape, and some shapes bring a fixed count."""
    problems = []
    for i, pool in enumerate(m.node_pools):
        facts = _facts(pool)
        count = pool.local_ssd_count
        if facts is None or count == 0 or count in facts.local_ssds:
            continue
        if facts.bundled:
            valid = f"0 (as the shape comes) or {facts.local_ssds[0]}, the count it always has"
        elif facts.local_ssds:
            valid = or_list([0, *facts.local_ssds])
        else:
            valid = "0 (it takes no local SSDs)"
        problems.append(Problem(at('nodePools', i, 'localSsdCount'), f"{pool.machine_type} does not take {count} local "
                        f"SSDs; use {valid}"))
    return problems


def check_boot_disk_type(m: StackConfig) -> list[Problem]:
    """Some shapes boot only from Hyperdisk (A3 Ultra, A4); older ones take no Hyperdisk Balanced (N1, G2, A2)."""
    problems = []
    for i, pool in enumerate(m.node_pools):
        facts = _facts(pool)
        if facts is not None and pool.disk_type not in facts.boot_disks:
            problems.append(Problem(at('nodePools', i, 'diskType'), f"{pool.machine_type} does not boot from "
                            f"{pool.disk_type}; use {or_list(list(facts.boot_disks))}"))
    return problems


CHECKS: list[Check] = [check_local_ssd_count, check_boot_disk_type]
