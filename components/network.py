"""Network: a custom-mode VPC, one subnet with pod and service ranges (flow logs when asked), explicit firewall
rules, and NAT for private nodes."""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from components import firewall
from model.types import FlowLogsConfig, NetworkConfig

PODS_RANGE = "pods"
SERVICES_RANGE = "services"


class NetworkArgs(msgspec.Struct, frozen=True):
    name: str
    region: str
    config: NetworkConfig
    # Private nodes have no external IPs: without Cloud NAT they cannot pull images or models.
    nat: bool
    # GPUDirect-TCPX(O) wants jumbo frames on the primary VPC too (data/gpu_fabric.yaml); None: GCE's default.
    mtu: int | None = None
    # A private cluster's control-plane range, which the firewall lets reach the nodes; None: public nodes.
    master_cidr: str | None = None
    # The region's proxy-only subnet for a server's Inference Gateway (regional Application Load Balancers); None: none.
    proxy_only_cidr: str | None = None


def flow_log_config(cfg: FlowLogsConfig) -> gcp.compute.SubnetworkLogConfigArgs | None:
    if not cfg.enabled:
        return None
    return gcp.compute.SubnetworkLogConfigArgs(aggregation_interval=cfg.aggregation_interval,
                                               flow_sampling=cfg.sampling, metadata="INCLUDE_ALL_METADATA")


class Network(pulumi.ComponentResource):
    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.vpc = gcp.compute.Network(
            f"{name}-vpc",
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=args.mtu,
            description=f"VPC for the {args.name} GKE cluster (deepspeed-stack)",
            opts=child,
        )
        self.subnet = gcp.compute.Subnetwork(
            f"{name}-subnet",
            region=args.region,
            network=self.vpc.id,
            ip_cidr_range=args.config.subnet_cidr,
            private_ip_google_access=True,
            secondary_ip_ranges=[
                gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=PODS_RANGE, ip_cidr_range=args.config.pods_cidr),
                gcp.compute.SubnetworkSecondaryIpRangeArgs(
                    range_name=SERVICES_RANGE, ip_cidr_range=args.config.services_cidr
                ),
            ],
            log_config=flow_log_config(args.config.flow_logs),
            opts=child,
        )
        for rule in firewall.rules(args.config.subnet_cidr, args.config.pods_cidr, args.master_cidr):
            gcp.compute.Firewall(
                f"{name}-{rule.suffix}", network=self.vpc.id, description=rule.description,
                direction=rule.direction, priority=rule.priority, source_ranges=rule.source_ranges,
                allows=rule.allows or None, denies=rule.denies or None, opts=child)
        outputs: dict[str, pulumi.Input] = {"network": self.vpc.id, "subnetwork": self.subnet.id}
        if args.proxy_only_cidr:
            # Where the Gateway's Envoy proxies run: one ACTIVE REGIONAL_MANAGED_PROXY subnet per region and VPC
            # (GKE "Deploy GKE Inference Gateway": configure a proxy-only subnet).
            self.proxy_subnet = gcp.compute.Subnetwork(
                f"{name}-proxy-only", region=args.region, network=self.vpc.id, ip_cidr_range=args.proxy_only_cidr,
                purpose="REGIONAL_MANAGED_PROXY", role="ACTIVE", opts=child)
            outputs["proxyOnlySubnetwork"] = self.proxy_subnet.id
        if args.nat:
            router = gcp.compute.Router(f"{name}-router", region=args.region, network=self.vpc.id, opts=child)
            nat = gcp.compute.RouterNat(
                f"{name}-nat",
                router=router.name,
                region=args.region,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
                opts=child,
            )
            outputs["nat"] = nat.name
        self.register_outputs(outputs)
