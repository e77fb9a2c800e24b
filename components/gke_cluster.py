"""GkeCluster: a hardened VPC-native GKE cluster, its small system pool, a kubeconfig and a k8s provider."""

from __future__ import annotations

import json

import msgspec
import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from components.network import PODS_RANGE, SERVICES_RANGE
from model.types import ClusterConfig

SYSTEM_POOL_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# gcloud's GetConnectGatewayServiceName (googlecloudsdk/command_lib/container/fleet/memberships/util.py): a
# membership in location L is reached through `L-connectgateway.googleapis.com`; only `global` uses the bare host.
CONNECT_GATEWAY_HOST = "connectgateway.googleapis.com"


class GkeClusterArgs(msgspec.Struct, frozen=True):
    project: str
    location: str
    config: ClusterConfig
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    node_service_account: pulumi.Input[str]
    # GPU fabrics attach extra NICs through multi-networking (model/fabric.py: multi_networking).
    multi_networking: bool = False
    # GKE's DCGM exporter into Managed Prometheus: GPU utilisation, memory and NVLink/PCIe metrics.
    gpu_metrics: bool = False
    # The subnet's secondary ranges for pods and services (an existing VPC names its own).
    pods_range: str = PODS_RANGE
    services_range: str = SERVICES_RANGE
    # Gateway API's channel (GKE's Gateway controller) for a server's Inference Gateway; None: off.
    gateway_api_channel: str | None = None


def _plugin_kubeconfig(context: str, cluster: dict[str, str]) -> str:
    """A kubeconfig that authenticates through `gke-gcloud-auth-plugin`, so it holds no credential itself."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "users": [{"name": context, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "gke-gcloud-auth-plugin",
            "installHint": "Install gke-gcloud-auth-plugin: gcloud components install gke-gcloud-auth-plugin",
            "provideClusterInfo": True,
        }}}],
    }, indent=2)


def kubeconfig(name: str, endpoint: str, ca_certificate: str) -> str:
    """The cluster's own endpoint, with its CA."""
    return _plugin_kubeconfig(f"gke_{name}", {"server": f"https://{endpoint}",
                                              "certificate-authority-data": ca_certificate})


def connect_gateway_host(location: str) -> str:
    """The gateway's host for a membership in `location`: regional unless the membership is global."""
    return CONNECT_GATEWAY_HOST if location == "global" else f"{location}-{CONNECT_GATEWAY_HOST}"


def connect_gateway_server(project_number: str, location: str, membership: str) -> str:
    return (f"https://{connect_gateway_host(location)}/v1/projects/{project_number}/locations/{location}"
            f"/gkeMemberships/{membership}")


def connect_gateway_kubeconfig(project_number: str, location: str, membership: str) -> str:
    """The Connect Gateway's URL for the cluster's fleet membership (as `gcloud container fleet memberships
    get-credentials` writes it): reachable from anywhere with IAM, even when the control plane is private.
    Google's public certificate, so no CA data."""
    return _plugin_kubeconfig(f"connectgateway_{membership}",
                              {"server": connect_gateway_server(project_number, location, membership)})


def _default_pool_node_config(args: GkeClusterArgs) -> gcp.container.ClusterNodeConfigArgs:
    """The temporary default pool's nodes (removed once the cluster exists) are hardened like every pool:
    an organization policy that requires Shielded VMs (compute.requireShieldedVm) would otherwise block the
    cluster's creation (checkov CKV_GCP_68 secure boot, CKV_GCP_69 GKE metadata server)."""
    return gcp.container.ClusterNodeConfigArgs(
        service_account=args.node_service_account,
        oauth_scopes=SYSTEM_POOL_SCOPES,
        shielded_instance_config=gcp.container.ClusterNodeConfigShieldedInstanceConfigArgs(
            enable_secure_boot=True, enable_integrity_monitoring=True),
        workload_metadata_config=gcp.container.ClusterNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
    )


def _fleet(cfg: ClusterConfig, project: str) -> gcp.container.ClusterFleetArgs | None:
    # The cluster's own `fleet` setting: GKE creates the membership with the cluster (no gkehub.Membership).
    return gcp.container.ClusterFleetArgs(project=cfg.fleet.project or project) if cfg.fleet.enabled else None


def _private_config(cfg: ClusterConfig) -> gcp.container.ClusterPrivateClusterConfigArgs | None:
    if not cfg.private_nodes:
        return None
    return gcp.container.ClusterPrivateClusterConfigArgs(
        enable_private_nodes=True,
        enable_private_endpoint=cfg.private_endpoint,
        master_ipv4_cidr_block=cfg.master_cidr,
        master_global_access_config=gcp.container.ClusterPrivateClusterConfigMasterGlobalAccessConfigArgs(
            enabled=True
        ),
    )


def _authorized_networks(cfg: ClusterConfig) -> gcp.container.ClusterMasterAuthorizedNetworksConfigArgs | None:
    if not cfg.authorized_networks and not cfg.private_nodes:
        return None
    # On a private cluster an empty list still turns the feature on: only the VPC may reach the endpoint.
    return gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
        cidr_blocks=[
            gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(cidr_block=n.cidr, display_name=n.name)
            for n in cfg.authorized_networks
        ],
    )


def _addons(cfg: ClusterConfig, gateway: bool = False) -> gcp.container.ClusterAddonsConfigArgs:
    return gcp.container.ClusterAddonsConfigArgs(
        gcs_fuse_csi_driver_config=gcp.container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(enabled=True),
        gcp_filestore_csi_driver_config=gcp.container.ClusterAddonsConfigGcpFilestoreCsiDriverConfigArgs(enabled=True),
        gce_persistent_disk_csi_driver_config=gcp.container.ClusterAddonsConfigGcePersistentDiskCsiDriverConfigArgs(
            enabled=True
        ),
        # GKE's Gateway controller (a server's Inference Gateway) needs it: GKE's default, said when a gateway relies
        # on it (other stacks' clusters keep their config as it was).
        http_load_balancing=gcp.container.ClusterAddonsConfigHttpLoadBalancingArgs(disabled=False) if gateway else None,
        # With Dataplane V2 network policy is built in; the Calico add-on is only for the legacy dataplane.
        network_policy_config=gcp.container.ClusterAddonsConfigNetworkPolicyConfigArgs(disabled=cfg.dataplane_v2),
    )


def _monitoring(gpu_metrics: bool) -> gcp.container.ClusterMonitoringConfigArgs:
    # System metrics, and with gpu_metrics GKE's DCGM exporter (GkeClusterArgs), into Managed Prometheus.
    return gcp.container.ClusterMonitoringConfigArgs(
        enable_components=["SYSTEM_COMPONENTS", *(["DCGM"] if gpu_metrics else [])],
        managed_prometheus=gcp.container.ClusterMonitoringConfigManagedPrometheusArgs(enabled=True),
    )


def _master_auth() -> gcp.container.ClusterMasterAuthArgs:
    # No client certificate: it is a credential that cannot be revoked (policy gke-no-client-certificate).
    return gcp.container.ClusterMasterAuthArgs(
        client_certificate_config=gcp.container.ClusterMasterAuthClientCertificateConfigArgs(
            issue_client_certificate=False
        ),
    )


class GkeCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:GkeCluster", name, None, opts)
        cfg = args.config
        # Registered in this order: the cluster, its system pool, then the provider (which waits for the pool).
        self.cluster = self._cluster(name, args)
        self.system_pool = self._system_pool(name, args)
        self.name: pulumi.Output[str] = self.cluster.name
        self.endpoint: pulumi.Output[str] = self.cluster.endpoint
        self.ca_certificate: pulumi.Output[str] = self.cluster.master_auth.cluster_ca_certificate
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.endpoint, self.ca_certificate).apply(
                lambda v: kubeconfig(v[0], v[1], v[2])
            )
        )
        self.connect_gateway_kubeconfig = self._connect_gateway(args) if cfg.fleet.enabled else None
        self.provider = self._k8s_provider(name)
        self.register_outputs({
            "name": self.name,
            "endpoint": self.endpoint,
            "caCertificate": self.ca_certificate,
            "kubeconfig": self.kubeconfig,
            **({"connectGatewayKubeconfig": self.connect_gateway_kubeconfig} if cfg.fleet.enabled else {}),
        })

    def _cluster(self, name: str, args: GkeClusterArgs) -> gcp.container.Cluster:
        """The VPC-native cluster, hardened (see policy/rules_gke.py), its default pool removed once it exists."""
        cfg = args.config
        return gcp.container.Cluster(
            name,
            name=cfg.name,
            project=args.project,
            location=args.location,
            network=args.network,
            subnetwork=args.subnetwork,
            networking_mode="VPC_NATIVE",
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(
                cluster_secondary_range_name=args.pods_range,
                services_secondary_range_name=args.services_range,
            ),
            # The default pool cannot be configured well (scopes, SA); replace it with our system pool.
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config=_default_pool_node_config(args),
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=cfg.release_channel),
            min_master_version=cfg.min_master_version,  # pool features with a minimum (flex-start) rely on it
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{args.project}.svc.id.goog"
            ),
            enable_shielded_nodes=True,
            # Pod-to-pod traffic on one node goes through the VPC too: flow logs and firewall rules see it
            # (checkov CKV_GCP_61).
            enable_intranode_visibility=True,
            datapath_provider="ADVANCED_DATAPATH" if cfg.dataplane_v2 else "LEGACY_DATAPATH",
            network_policy=None if cfg.dataplane_v2 else gcp.container.ClusterNetworkPolicyArgs(
                enabled=True, provider="CALICO"
            ),
            addons_config=_addons(cfg, gateway=args.gateway_api_channel is not None),
            gateway_api_config=gcp.container.ClusterGatewayApiConfigArgs(channel=args.gateway_api_channel)
            if args.gateway_api_channel else None,
            logging_config=gcp.container.ClusterLoggingConfigArgs(
                enable_components=["SYSTEM_COMPONENTS", "WORKLOADS"]
            ),
            enable_multi_networking=args.multi_networking or None,
            monitoring_config=_monitoring(args.gpu_metrics),
            master_auth=_master_auth(),
            enable_legacy_abac=False,
            private_cluster_config=_private_config(cfg),
            master_authorized_networks_config=_authorized_networks(cfg),
            deletion_protection=cfg.deletion_protection,
            fleet=_fleet(cfg, args.project),
            resource_labels={"managed-by": "pulumi", "stack": "deepspeed-stack"},
            # After the default pool is removed GKE reports another pool's config as the cluster's nodeConfig;
            # some of its fields force a new cluster, so the cluster never diffs on it.
            # `name` is fixed: a change that forces replacement (datapath, master CIDR, ...) must delete the old
            # cluster first, or the create fails with "already exists" (the preview warns of it in words).
            opts=pulumi.ResourceOptions(parent=self, protect=cfg.deletion_protection,
                                        ignore_changes=["nodeConfig"], delete_before_replace=True),
        )

    def _system_pool(self, name: str, args: GkeClusterArgs) -> gcp.container.NodePool:
        """The small pool kube-system runs on (DNS, the CSI drivers); GPU pools are GpuNodePool's."""
        cfg = args.config
        return gcp.container.NodePool(
            f"{name}-system",
            project=args.project,
            cluster=self.cluster.name,
            location=args.location,
            node_locations=cfg.system_pool.zones or None,
            # Without an initial count the pool starts empty until pods ask for nodes; per zone.
            initial_node_count=1,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                total_min_node_count=cfg.system_pool.min_nodes,
                total_max_node_count=cfg.system_pool.max_nodes,
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=cfg.system_pool.machine_type,
                image_type="COS_CONTAINERD",
                service_account=args.node_service_account,
                oauth_scopes=SYSTEM_POOL_SCOPES,
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
                    enable_secure_boot=True, enable_integrity_monitoring=True
                ),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                labels={"deepspeed-stack/pool": "system"},
            ),
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["initialNodeCount"]),
        )

    def _k8s_provider(self, name: str) -> k8s.Provider:
        """The cluster's Kubernetes provider (not named `_provider`: pulumi.Resource keeps its own provider there)."""
        return k8s.Provider(
            f"{name}-k8s",
            # Through the gateway when the cluster is in a fleet: CI runners cannot reach a private
            # control plane (or one behind authorized networks), the gateway they can.
            kubeconfig=self.connect_gateway_kubeconfig or self.kubeconfig,
            enable_server_side_apply=True,
            # Every workload goes through this provider, so all of them wait for the nodes that run kube-system
            # (DNS, the CSI drivers) and `destroy` removes them before those nodes.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.system_pool]),
        )

    def _connect_gateway(self, args: GkeClusterArgs) -> pulumi.Output[str]:
        """The gateway URL needs the fleet project's number and the membership GKE created for the cluster
        (named after the cluster, in the cluster's location unless GKE reports otherwise)."""
        number = gcp.organizations.get_project_output(project_id=args.config.fleet.project or args.project).number
        fleet = self.cluster.fleet
        membership = fleet.apply(lambda f: f.membership_id if f and f.membership_id else None)
        location = fleet.apply(lambda f: f.membership_location if f and f.membership_location else None)
        return pulumi.Output.secret(pulumi.Output.all(number, location, membership, self.cluster.location,
                                                      self.cluster.name).apply(
            lambda v: connect_gateway_kubeconfig(str(v[0]), v[1] or v[3], v[2] or v[4])))
