"""deepspeed-stack: config -> validated model -> GCP platform -> workloads -> outputs."""

import pulumi

from components.artifact_registry import ArtifactRegistry, ArtifactRegistryArgs
from components.container_image import ContainerImage, ContainerImageArgs
from components.gke_cluster import GkeCluster, GkeClusterArgs
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.network import Network, NetworkArgs
from components.node_identity import NodeIdentity, NodeIdentityArgs
from model import catalog
from model.config import load

cfg = load()  # every config problem at once, as a pulumi.RunError naming its keys

if cfg.cluster is not None:
    # GCP platform: identity, network, cluster, one pool per nodePools entry, registry and image.
    identity = NodeIdentity("nodes", NodeIdentityArgs(project=cfg.project, cluster_name=cfg.cluster.name))
    network = Network("network", NetworkArgs(name=cfg.cluster.name, region=cfg.region, config=cfg.network,
                                             nat=cfg.cluster.private_nodes))
    cluster = GkeCluster("cluster", GkeClusterArgs(
        project=cfg.project, location=cfg.cluster_location, config=cfg.cluster,
        network=network.vpc.id, subnetwork=network.subnet.id, node_service_account=identity.email))
    pools = {
        p.name: GpuNodePool(f"pool-{p.name}", GpuNodePoolArgs(
            project=cfg.project, location=cfg.cluster_location, cluster_name=cluster.name,
            node_service_account=identity.email, config=p,
            zones=p.zones or list(catalog.load().zones(p.gpu.type, cfg.region))))
        for p in cfg.node_pools
    }
    registry = ArtifactRegistry("registry", ArtifactRegistryArgs(
        project=cfg.project, region=cfg.region, config=cfg.registry, reader_service_account=identity.email))
    image = ContainerImage("image", ContainerImageArgs(
        config=cfg.image, registry_host=registry.host, repository_url=registry.url))

    pulumi.export("clusterName", cluster.name)
    pulumi.export("clusterEndpoint", cluster.endpoint)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("nodeServiceAccount", identity.email)
    pulumi.export("registryUrl", registry.url)
    pulumi.export("imageRef", image.ref)
    pulumi.export("nodePools", {name: pool.node_pool.name for name, pool in pools.items()})
