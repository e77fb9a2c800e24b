"""GPU fabric contracts (`data/gpu_fabric.yaml`) and the stack's fabric plan derived from them.

A machine family's contract says what its pools need to reach full GPU-to-GPU bandwidth: extra VPCs
(NIC count and kind, MTU, network profile), bundled local SSDs, the NCCL plugin installer (and NRI
injector), the per-pod daemon, NCCL environment and the minimum GKE versions. Checks, components,
workloads and the docs all read it from here, so a fact changes in one place.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from model import catalog as gpu_catalog
from model.types import NodePoolConfig, StackConfig
from model.yamlio import load_yaml

FABRIC_PATH = Path(__file__).resolve().parent.parent / "data" / "gpu_fabric.yaml"
SUBNET_PREFIX = 24  # CT multivpc: one /24 per GPU subnet


class Vpc(msgspec.Struct, frozen=True):
    name: str
    device_mode: str  # NetDevice | RDMA (GKENetworkParamSet.spec.deviceMode)
    nics: tuple[str, ...]  # Kubernetes Network names, one subnet each, in additionalNodeNetworkConfigs order
    network_profile: str | None = None  # "{zone}-vpc-roce" for the RoCE VPC

    @property
    def rdma(self) -> bool:
        return self.device_mode == "RDMA"


class HostVolume(msgspec.Struct, frozen=True):
    name: str
    host_path: str
    mount_path: str
    daemon: bool
    app: bool
    daemon_mount_path: str | None = None
    raw_mount_path: str | None = None  # the pinned manifest's mount path where the stack deviates (and says why)


class Daemon(msgspec.Struct, frozen=True):
    name: str
    image: str
    command: tuple[str, ...]
    capabilities: tuple[str, ...]
    devices: tuple[str, ...]
    health_check_file: str = ""  # HEALTH_CHECK_LOG_FILE: the daemon writes it once initialized (TCPXO)
    startup_probe: dict | None = None  # the probe Google recommends on that file
    manifest: str = ""  # the pinned pod manifest (container-engine-accelerators path) its settings come from


class Installer(msgspec.Struct, frozen=True):
    manifest: str  # path in container-engine-accelerators
    daemon_set: str
    image: str


class NcclPassLine(msgspec.Struct, frozen=True):
    """The bus bandwidth a machine type's NCCL test must reach (data/gpu_fabric.yaml passLines): the average busbw
    of `benchmark` over min_bytes..max_bytes (doubling), as Google's daily test computes it on its nodes."""

    machine_type: str
    benchmark: str
    average_gbps: float
    min_bytes: str  # a size as the stack config writes one (1Mi, 8Gi, 8)
    max_bytes: str
    nodes: int  # the nodes Google's line was measured on
    source: str
    example_average_gbps: float | None = None  # Google's published run on those nodes, where there is one
    example_bytes: int | None = None
    example_gbps: float | None = None  # its busbw at example_bytes

    def flag(self) -> str:
        """nccl_bench.py's --pass-line: BENCHMARK:GBPS:MIN:MAX."""
        return f"{self.benchmark}:{self.average_gbps:g}:{self.min_bytes}:{self.max_bytes}"

    def summary(self) -> str:
        return (f"{self.benchmark} average bus bandwidth >= {self.average_gbps:g} GB/s over {self.min_bytes}.."
                f"{self.max_bytes} bytes ({self.source}, {self.nodes} nodes)")

    def note(self) -> str:
        """Where the line comes from, and what Google measured, for the test's failure message."""
        text = f"{self.machine_type}: {self.source}, {self.nodes} nodes"
        if self.example_average_gbps is not None and self.example_bytes is not None:
            text += (f"; Google's example run averaged {self.example_average_gbps:g} GB/s, {self.example_gbps:g} GB/s "
                     f"at {self.example_bytes} bytes")
        return text


class NcclTestSpec(msgspec.Struct, frozen=True):
    image: str
    binaries: str
    reference_bus_bandwidth: str
    pass_lines: dict[str, NcclPassLine] = {}  # machine type -> its line


class Fabric(msgspec.Struct, frozen=True):
    name: str  # tcpx | tcpxo | rdma
    display_name: str
    family: str
    machine_types: dict[str, str]  # machine type -> gke-accelerator
    max_bandwidth_gbps: int
    mtu: int
    primary_mtu: int | None
    local_ssds: int
    vpcs: tuple[Vpc, ...]
    pod_interfaces: dict[str, str]  # eth -> Network name
    installer: Installer
    nri: bool
    daemon: Daemon | None
    host_volumes: tuple[HostVolume, ...]
    shm_size: str
    nccl_env: dict[str, str]
    nccl_profile: str
    min_gke_versions: tuple[str, ...]
    nccl_test: NcclTestSpec
    nccl_network: str = ""  # the network the plugin registers: NCCL's "Using network" line names it
    rank_devices: str = ""  # RDMA: the device directory every rank must open read-write (/dev/infiniband)
    nccl_minimum: str | None = None  # the oldest NCCL core the fabric's plugin works with ([U] where so marked)
    nccl_qualified: str | None = None  # the NCCL Google qualifies the plugin with

    @property
    def nics(self) -> tuple[str, ...]:
        """Every extra NIC's Network name, in the order the pool attaches them (gVNIC first, then RDMA)."""
        return tuple(nic for vpc in self.vpcs for nic in vpc.nics)

    @property
    def zonal(self) -> bool:
        """A RoCE network profile is per zone, so such a fabric's VPCs (and pools) are too."""
        return any(v.network_profile for v in self.vpcs)


class FabricCatalog(msgspec.Struct, frozen=True):
    source: str
    date: str
    manifest_base: str
    manifest_commit: str
    nri_manifest: str
    nri_image: str
    fabrics: dict[str, Fabric]
    monitoring_component: str
    gpu_taint: dict[str, str]
    nccl_log_env: dict[str, str]  # NCCL_DEBUG / NCCL_DEBUG_SUBSYS that show which network NCCL used

    def for_machine(self, machine_type: str) -> Fabric | None:
        return next((f for f in self.fabrics.values() if machine_type in f.machine_types), None)

    def url(self, manifest: str) -> str:
        return f"{self.manifest_base}/{manifest}"


def _fabric(name: str, raw: dict) -> Fabric:
    daemon = raw.get("daemon")
    test = raw["ncclTest"]
    return Fabric(
        name=name,
        display_name=raw["displayName"],
        family=raw["family"],
        machine_types=dict(raw["machineTypes"]),
        max_bandwidth_gbps=int(raw["maxBandwidthGbps"]),
        mtu=int(raw["mtu"]),
        primary_mtu=raw.get("primaryMtu"),
        local_ssds=int(raw["localSsds"]),
        vpcs=tuple(Vpc(v["name"], v["deviceMode"], tuple(v["nics"]), v.get("networkProfile")) for v in raw["vpcs"]),
        pod_interfaces=dict(raw["podInterfaces"]),
        installer=Installer(raw["installer"]["manifest"], raw["installer"]["daemonSet"], raw["installer"]["image"]),
        nri=bool(raw["nri"]),
        daemon=Daemon(daemon["name"], daemon["image"], tuple(daemon["command"]), tuple(daemon["capabilities"]),
                      tuple(daemon["devices"]), str(daemon.get("healthCheckFile") or ""),
                      daemon.get("startupProbe"), str(daemon.get("manifest") or "")) if daemon else None,
        host_volumes=tuple(HostVolume(v["name"], v["hostPath"], v["mountPath"], bool(v["daemon"]), bool(v["app"]),
                                      v.get("daemonMountPath"), v.get("referenceMountPath"))
                           for v in raw["hostVolumes"]),
        shm_size=str(raw.get("shmSize") or ""),
        nccl_env={k: str(v) for k, v in raw["ncclEnv"].items()},
        nccl_profile=str(raw.get("ncclProfile") or ""),
        min_gke_versions=tuple(raw["minGkeVersions"]),
        nccl_test=NcclTestSpec(test["image"], test["binaries"], test["referenceBusBandwidth"],
                               {machine: _pass_line(machine, line) for machine, line in test["passLines"].items()}),
        nccl_network=str(raw["ncclNetwork"]),
        rank_devices=str((raw.get("rankNeeds") or {}).get("devices") or ""),
        nccl_minimum=_version_text(raw["nccl"].get("minimum")),
        nccl_qualified=_version_text(raw["nccl"].get("qualified")),
    )


def _pass_line(machine_type: str, raw: dict) -> NcclPassLine:
    return NcclPassLine(
        machine_type=machine_type, benchmark=raw["benchmark"], average_gbps=float(raw["averageGBps"]),
        min_bytes=str(raw["minBytes"]), max_bytes=str(raw["maxBytes"]), nodes=int(raw["nodes"]), source=raw["source"],
        example_average_gbps=raw.get("exampleAverageGBps"), example_bytes=raw.get("exampleBytes"),
        example_gbps=raw.get("exampleGBps"))


def _version_text(value: object) -> str | None:
    return None if value is None else str(value)


def nccl_key(version: str) -> tuple[int, ...]:
    """`2.28.7` (or `2.28.7-1`, NCCL's release suffix) -> (2, 28, 7), for comparing NCCL versions."""
    return tuple(int(part) for part in version.split("-")[0].split("."))


def parse(raw: dict) -> FabricCatalog:
    return FabricCatalog(
        source=raw["source"],
        date=str(raw["date"]),
        manifest_base=raw["manifestBase"].rstrip("/"),
        manifest_commit=raw["manifestCommit"],
        nri_manifest=raw["nriInjector"]["manifest"],
        nri_image=raw["nriInjector"]["image"],
        fabrics={name: _fabric(name, f) for name, f in raw["fabrics"].items()},
        monitoring_component=raw["cluster"]["monitoringComponent"],
        gpu_taint=dict(raw["cluster"]["gpuTaint"]),
        nccl_log_env={k: str(v) for k, v in raw["ncclLog"]["env"].items()},
    )


@functools.cache
def load(path: Path = FABRIC_PATH) -> FabricCatalog:
    return parse(load_yaml(path))


# --- GKE versions ---------------------------------------------------------------------------------

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?$")
_NEWEST = 10**12  # a prefix such as "1.32" lets GKE pick the minor's current patch: newer than any minimum


def version_key(version: str) -> tuple[int, int, int, int] | None:
    """`1.32.11-gke.1174000` -> (1, 32, 11, 1174000); a missing part counts as GKE's newest; None if not a version."""
    match = _VERSION.match(version.strip())
    if not match:
        return None
    major, minor, patch, gke = match.groups()
    return (int(major), int(minor), int(patch) if patch else _NEWEST,
            int(gke) if gke else (_NEWEST if not patch else 0))


def meets_minimum(version: str, minimums: tuple[str, ...]) -> bool:
    """The minimums are the oldest supported patch per minor (CT gpu_direct.tf): a minor below the first is
    unsupported, a listed minor must reach its patch, a minor above the last listed one is supported."""
    key = version_key(version)
    floors = sorted(k for k in (version_key(m) for m in minimums) if k)
    if key is None or not floors:
        return key is not None
    if key[:2] < floors[0][:2]:
        return False
    same_minor = [f for f in floors if f[:2] == key[:2]]
    return key >= same_minor[0] if same_minor else True


# --- the stack's fabric plan ----------------------------------------------------------------------

def pool_fabric(pool: NodePoolConfig) -> Fabric | None:
    """The contract a pool follows: its machine family's, unless the pool turns the fabric off."""
    if not pool.fabric.enabled:
        return None
    return load().for_machine(pool.machine_type)


def pool_local_ssds(pool: NodePoolConfig) -> int:
    """The local SSDs backing a pool's ephemeral storage (emptyDir): its count, or when that is 0 the count its
    fabric's machine comes with (components/gpu_node_pool.py asks GKE for the same)."""
    fabric = pool_fabric(pool)
    return pool.local_ssd_count or (fabric.local_ssds if fabric else 0)


def pass_line(pool: NodePoolConfig) -> NcclPassLine | None:
    """The bus bandwidth an NCCL test on the pool must reach: its fabric's line for its machine type."""
    f = pool_fabric(pool)
    return f.nccl_test.pass_lines.get(pool.machine_type) if f else None


def pool_zones(m: StackConfig, pool: NodePoolConfig) -> list[str]:
    """The pool's zones, or every zone of the region that offers its GPU (as the stack places it)."""
    return list(pool.zones or gpu_catalog.load().zones(pool.gpu.type, m.region))


class Subnet(msgspec.Struct, frozen=True):
    nic: str  # the Kubernetes Network name (vpc1, rdma-0, ...)
    cidr: str


class PlannedVpc(msgspec.Struct, frozen=True):
    vpc: Vpc
    subnets: tuple[Subnet, ...]
    network_profile: str | None  # resolved: us-central1-b-vpc-roce


class FabricSet(msgspec.Struct, frozen=True):
    """One set of extra VPCs, shared by every pool of the same fabric (and zone, for a zonal fabric)."""

    key: str  # resource-name part: tcpxo, rdma-us-central1-b
    fabric: Fabric
    zone: str | None
    pools: tuple[str, ...]
    vpcs: tuple[PlannedVpc, ...]

    @property
    def network_names(self) -> tuple[str, ...]:
        """Kubernetes Network names (cluster-wide: two sets must not share one; checks/fabric.py refuses that)."""
        return tuple(s.nic for v in self.vpcs for s in v.subnets)


def _subnets(cidr: str) -> Iterator[str]:
    """The /24s of `cidr` in order, lazily: a /16 holds 256 and a stack takes a handful (most none), and
    building them all cost a third of every config load."""
    try:
        network = ipaddress.IPv4Network(cidr, strict=False)
    except ValueError:
        return iter(())  # checks/fabric.py reports it
    if network.prefixlen > SUBNET_PREFIX:
        return iter(())
    return (str(s) for s in network.subnets(new_prefix=SUBNET_PREFIX))


def fabric_sets(m: StackConfig) -> list[FabricSet]:
    """The extra VPCs the stack's fabric pools need, with /24 subnets carved in order from network.fabricCidr.

    Pools of one fabric share its VPCs (a zonal fabric: per zone), so a second A3 Mega pool adds no networks."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for pool in m.node_pools:
        fabric = pool_fabric(pool)
        if fabric is None:
            continue
        zones = pool_zones(m, pool)
        zone = zones[0] if fabric.zonal and zones else None
        groups.setdefault((fabric.name, zone), []).append(pool.name)
    free = _subnets(m.network.fabric_cidr)
    sets = []
    for (name, zone), pools in groups.items():
        fabric = load().fabrics[name]
        vpcs = []
        for vpc in fabric.vpcs:
            subnets = tuple(Subnet(nic, next(free, "")) for nic in vpc.nics)
            profile = vpc.network_profile.format(zone=zone) if vpc.network_profile and zone else None
            vpcs.append(PlannedVpc(vpc, subnets, profile))
        sets.append(FabricSet(f"{name}-{zone}" if zone else name, fabric, zone, tuple(pools), tuple(vpcs)))
    return sets


def subnets_needed(m: StackConfig) -> int:
    return sum(len(v.subnets) for s in fabric_sets(m) for v in s.vpcs)


def set_for_pool(m: StackConfig, pool_name: str) -> FabricSet | None:
    return next((s for s in fabric_sets(m) if pool_name in s.pools), None)


def primary_mtu(m: StackConfig) -> int | None:
    """The primary VPC's MTU the stack's fabrics ask for (TCPX/TCPXO: 8244, RDMA: 8896), or None for GCE's default."""
    wanted = [s.fabric.primary_mtu for s in fabric_sets(m) if s.fabric.primary_mtu]
    return max(wanted) if wanted else None


def multi_networking(m: StackConfig) -> bool:
    """cluster.multiNetworking as set, else on exactly when a pool has a fabric (its NICs need it)."""
    if m.cluster is None:
        return False
    if m.cluster.multi_networking is not None:
        return m.cluster.multi_networking
    return bool(fabric_sets(m))


def additional_networks(pool: NodePoolConfig) -> int:
    """How many extra NICs the pool attaches: the config's count, else the contract's."""
    f = pool_fabric(pool)
    if f is None:
        return 0
    return len(f.nics) if pool.fabric.additional_networks is None else pool.fabric.additional_networks


def installs(m: StackConfig, fabric_set: FabricSet) -> bool:
    """Apply the set's installer when any of its pools asks for it (checks/fabric.py refuses a pool without)."""
    return any((p := m.pool(name)) is not None and p.fabric.installer for name in fabric_set.pools)
