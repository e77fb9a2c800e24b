"""FabricNetwork: the extra VPCs and subnets of one GPU fabric set, beside the cluster's primary network.

Per the contract (data/gpu_fabric.yaml, from Cluster Toolkit's multivpc / gpu-rdma-vpc modules): TCPX 4 and
TCPXO 8 VPCs of one subnet each, RDMA one gVNIC VPC plus one RoCE VPC with 8 subnets; every VPC at the
contract's MTU. gVNIC VPCs allow tcp/udp/icmp from the fabric range; a RoCE VPC gets no firewall rules at
all (GCE refuses them on a VPC with the RoCE network profile).
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from model.fabric import FabricSet, PlannedVpc


class FabricNetworkArgs(msgspec.Struct, frozen=True):
    project: str
    region: str
    fabric_set: FabricSet
    fabric_cidr: str  # source range of the gVNIC VPCs' allow-internal rule


class NicNetwork(msgspec.Struct, frozen=True):
    """Where one extra NIC attaches: the VPC and subnet names the pool and GKENetworkParamSet name."""

    nic: str
    device_mode: str
    network: pulumi.Output[str]
    subnetwork: pulumi.Output[str]


def network_profile(project: str, profile: str) -> str:
    return f"projects/{project}/global/networkProfiles/{profile}"


def firewall_allow(protocols: tuple[str, ...] = ("tcp", "udp", "icmp")) -> list[gcp.compute.FirewallAllowArgs]:
    return [gcp.compute.FirewallAllowArgs(protocol=p) for p in protocols]


class FabricNetwork(pulumi.ComponentResource):
    def __init__(self, name: str, args: FabricNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:FabricNetwork", name, None, opts)
        self.nics: list[NicNetwork] = []
        self.networks: list[gcp.compute.Network] = []
        for planned in args.fabric_set.vpcs:
            self._vpc(name, args, planned)
        self.register_outputs({
            "fabric": args.fabric_set.fabric.name,
            "networks": {n.nic: n.network for n in self.nics},
            "subnetworks": {n.nic: n.subnetwork for n in self.nics},
        })

    def node_networks(self, count: int) -> list[tuple[pulumi.Output[str], pulumi.Output[str]]]:
        """The first `count` NICs' (network, subnetwork), in the contract's order (gVNIC first, then RDMA)."""
        return [(n.network, n.subnetwork) for n in self.nics[:count]]

    def _vpc(self, name: str, args: FabricNetworkArgs, planned: PlannedVpc) -> None:
        child = pulumi.ResourceOptions(parent=self)
        fabric, vpc = args.fabric_set.fabric, planned.vpc
        # Auto-named: a VPC that must be replaced (MTU, profile) is created beside the old one.
        network = gcp.compute.Network(
            f"{name}-{vpc.name}",
            project=args.project,
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=fabric.mtu,
            network_profile=network_profile(args.project, planned.network_profile) if planned.network_profile
            else None,
            description=f"{fabric.display_name} {vpc.device_mode} VPC {vpc.name} (deepspeed-stack)",
            opts=child,
        )
        self.networks.append(network)
        for subnet in planned.subnets:
            sub = gcp.compute.Subnetwork(
                f"{name}-{subnet.nic}-subnet",
                project=args.project,
                region=args.region,
                network=network.id,
                ip_cidr_range=subnet.cidr,
                opts=child,
            )
            self.nics.append(NicNetwork(subnet.nic, vpc.device_mode, network.name, sub.name))
        if not vpc.rdma:
            gcp.compute.Firewall(
                f"{name}-{vpc.name}-internal",
                project=args.project,
                network=network.id,
                direction="INGRESS",
                source_ranges=[args.fabric_cidr],
                allows=firewall_allow(),
                description="GPU NIC traffic between the fabric's nodes (deepspeed-stack)",
                opts=child,
            )
