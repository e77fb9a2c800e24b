"""deepspeed-stack: config -> validated model -> GCP platform -> workloads -> outputs.

Each section declares only what the config asks for and depends only on what it really needs, so
`pulumi up` takes as long as the longest real chain (cluster -> pool -> workload), no longer.
"""

import pulumi

import checks
from components import gaudi_image as gaudi
from components import serving_dashboard as dashboards
from components.artifact_registry import ArtifactRegistry, ArtifactRegistryArgs
from components.container_image import ContainerImage, ContainerImageArgs
from components.fabric_network import FabricNetwork, FabricNetworkArgs
from components.gke_cluster import GkeCluster, GkeClusterArgs
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.metrics_adapter import MetricsAdapter, MetricsAdapterArgs
from components.network import Network, NetworkArgs
from components.node_identity import NodeIdentity, NodeIdentityArgs
from components.storage import Storage, StorageArgs
from components.vertex import VertexTraining, VertexTrainingArgs
from model import capacity, catalog, fabric, serving_gateway, serving_metrics, versions
from planner import cost, recovery
from planner.capacity_plan import capacity_plan
from workloads import first_up, kinds
from workloads.compute_class import ComputeClasses, ComputeClassesArgs
from workloads.gcs_fuse import BucketAccess
from workloads.gpu_fabric import GpuFabric, GpuFabricArgs
from workloads.kueue import Kueue, KueueArgs, end_namespaces, end_waits, flavor_pools
from workloads.leader_worker_set import LeaderWorkerSetController, LeaderWorkerSetControllerArgs, group_servers
from workloads.mpi_operator import MpiOperator, MpiOperatorArgs
from workloads.nccl_test import NcclTest, NcclTestInputs
from workloads.nfs_provisioner import NfsProvisioner, NfsProvisionerArgs
from workloads.pull_secret import RegistryLogin
from workloads.target import ExistingCluster, ExistingClusterArgs, needs_kubernetes

# 1. Config: every problem at once as a pulumi.RunError naming its keys; tight fits only warn.
cfg = checks.load()
for warning in checks.warnings(cfg):
    pulumi.log.warn(warning)

# 2. GKE platform: node identity, network, cluster and one auto-named pool per nodePools entry.
cluster, identity, pools = None, None, {}
if cfg.cluster is not None:
    identity = NodeIdentity("nodes", NodeIdentityArgs(project=cfg.project, cluster_name=cfg.cluster.name))
    # The stack's own VPC, or an existing one (`network.existing`: yours or a Shared VPC's, its owner's to run).
    existing = cfg.network.existing
    network = Network("network", NetworkArgs(
        name=cfg.cluster.name, region=cfg.region, config=cfg.network, nat=cfg.cluster.private_nodes,
        mtu=fabric.primary_mtu(cfg), master_cidr=cfg.cluster.master_cidr if cfg.cluster.private_nodes else None,
        proxy_only_cidr=cfg.network.proxy_only_cidr if serving_gateway.servers(cfg) else None)) \
        if existing is None else None
    # GPU fabrics (A3/A4): the extra VPCs their NICs attach to, one set per fabric (data/gpu_fabric.yaml).
    fabric_networks = {s.key: FabricNetwork(f"fabric-{s.key}", FabricNetworkArgs(
        project=cfg.project, region=cfg.region, fabric_set=s, fabric_cidr=cfg.network.fabric_cidr))
        for s in fabric.fabric_sets(cfg)}
    cluster = GkeCluster("cluster", GkeClusterArgs(
        project=cfg.project, location=cfg.cluster_location, config=cfg.cluster,
        network=network.vpc.id if network else cfg.network.existing.network,
        subnetwork=network.subnet.id if network else cfg.network.existing.subnetwork,
        **({"pods_range": existing.pods_range, "services_range": existing.services_range} if existing else {}),
        node_service_account=identity.email,
        multi_networking=fabric.multi_networking(cfg), gpu_metrics=bool(cfg.node_pools),
        gateway_api_channel=serving_gateway.load().gateway_api_channel if serving_gateway.servers(cfg) else None))
    fabric_of = {pool: fabric_networks[s.key] for s in fabric.fabric_sets(cfg) for pool in s.pools}
    joins = capacity.pool_classes(cfg)  # pool -> the ComputeClass of a workload's pool then fallbackPool
    pools = {p.name: GpuNodePool(f"pool-{p.name}", GpuNodePoolArgs(
        project=cfg.project, location=cfg.cluster_location, cluster_name=cluster.name,
        node_service_account=identity.email, config=p,
        zones=p.zones or list(catalog.load().zones(p.gpu.type, cfg.region)), fabric=fabric.pool_fabric(p),
        additional_networks=fabric_of[p.name].node_networks(fabric.additional_networks(p))
        if p.name in fabric_of else [], compute_class=joins.get(p.name))) for p in cfg.node_pools}

# 3. The image, for GKE and Vertex alike: registry and build wait for neither the cluster nor the pools.
registry, image = None, None
if cfg.cluster is not None or cfg.vertex.enabled:
    registry = ArtifactRegistry("registry", ArtifactRegistryArgs(
        project=cfg.project, region=cfg.region, config=cfg.registry,
        reader_service_account=identity.email if identity else None))
    image = ContainerImage("image", ContainerImageArgs(
        config=cfg.image, registry_host=registry.host, repository_url=registry.url,
        build_args=versions.load().build_args()))  # the one version set (data/versions.yaml)

# 3b. The Gaudi image for Gaudi MPIJobs (unless they name an `image` or opt into installing at start): to the
#     stack's Artifact Registry with Google Cloud settings, else to gaudiImage.registry; pods pull it by digest,
#     with a pull Secret when the registry wants a login.
gaudi_ref, gaudi_login = None, None
gaudi_jobs = gaudi.workloads_on_it(cfg)
if gaudi_jobs:
    if registry is None and gaudi.uses_artifact_registry(cfg):
        registry = ArtifactRegistry("registry", ArtifactRegistryArgs(
            project=cfg.project, region=cfg.region, config=cfg.registry))
    on_gcp = registry is not None
    push_to = registry.url if on_gcp else cfg.gaudi_image.registry or ""
    host = registry.host if on_gcp else gaudi.registry_host(cfg.gaudi_image.prebuilt or push_to)
    # Artifact Registry: the deploying identity's token; elsewhere the configured login (or the host's own).
    login = {} if on_gcp else {"username": cfg.gaudi_image.username, "password": cfg.registry_password}
    gaudi_ref = ContainerImage("gaudi-image", ContainerImageArgs(
        config=cfg.gaudi_image, registry_host=host, repository_url=push_to,
        build_args={} if cfg.gaudi_image.prebuilt else gaudi.build_args(gaudi_jobs[0]), **login)).ref
    if cfg.gaudi_image.username and cfg.registry_password is not None:
        gaudi_login = RegistryLogin(host=host, username=cfg.gaudi_image.username, password=cfg.registry_password)

# 4. Data: one bucket for datasets, checkpoints and logs; GKE pods reach it as a Workload Identity account.
storage, bucket = None, None
if cfg.storage.enabled:
    ksa = cfg.storage.kubernetes_service_account
    storage = Storage("storage", StorageArgs(
        project=cfg.project, location=cfg.storage.location or cfg.region, config=cfg.storage,
        kubernetes_accounts=sorted({(w.namespace, ksa) for w in cfg.workloads.values() if w.gcs_fuse.enabled}),
        workload_identity=cluster is not None,
        identity_pool_ready=[cluster.cluster] if cluster else [], stack=pulumi.get_stack(),
        protect=bool(cfg.cluster and cfg.cluster.deletion_protection)))
    bucket = BucketAccess(bucket=storage.bucket_name, google_service_account=storage.email,
                          kubernetes_service_account=ksa)

# 5. Where workloads go: the stack's GKE cluster, or an existing cluster (Gaudi/Omnia) from a secret kubeconfig.
#    There the stack adopts only the namespace and the claim (`adopt_with`; kept on destroy): everything else goes
#    through `create_only`, so an MPIJob, an MPI operator or any object of the same name that was there before stops
#    pulumi up instead of being taken over (and deleted on destroy).
target, adopt_with = cluster.provider if cluster else None, None
if cluster is None and needs_kubernetes(cfg):
    existing = ExistingCluster("target", ExistingClusterArgs(kubeconfig=cfg.kubeconfig, context=cfg.kubernetes.context))
    target, adopt_with = existing.create_only, existing.provider

# 6. Workloads, each waiting only for its own pool (and the MPI operator's CRD for MPIJobs).
workload_summary, serving_endpoints = {}, {}
if target is not None:
    on_target = pulumi.ResourceOptions(provider=target)
    operator = MpiOperator("mpi-operator", MpiOperatorArgs(config=cfg.mpi_operator, own_cluster=cluster is not None),
                           on_target) if cfg.mpi_operator.install else None
    nfs = NfsProvisioner("nfs-provisioner", NfsProvisionerArgs(config=cfg.nfs_provisioner), on_target) \
        if cfg.nfs_provisioner.install else None
    # GPU fabrics: a Network per extra NIC, the NCCL plugin installer (+ NRI injector), keyed by pool.
    gpu_fabrics = {pool: f for s in (fabric.fabric_sets(cfg) if cluster else []) for f in [GpuFabric(
        f"gpu-fabric-{s.key}", GpuFabricArgs(fabric_set=s, nics=fabric_networks[s.key].nics,
                                            install=fabric.installs(cfg, s)), on_target)] for pool in s.pools}
    # ComputeClasses: spot, then on-demand (a workload's pool, then its fallbackPool) in the autoscaler's order.
    classes = ComputeClasses("compute-classes", ComputeClassesArgs(
        chains=list(capacity.chains(cfg).values()),
        node_pool_names={name: pool.node_pool.name for name, pool in pools.items()}), on_target).classes \
        if cluster and capacity.chains(cfg) else {}
    # Kueue: a flavor per pool a queued job uses, one ClusterQueue in the jobs' order; after the MPI operator, so
    # Kueue's MPIJob integration finds its CRD. Before the workloads: a queued MPIJob waits for its webhooks.
    kueue = Kueue("kueue", KueueArgs(config=cfg.kueue, pools=flavor_pools(cfg),
                                     end_namespaces=end_namespaces(cfg, flavor_pools(cfg)),
                                     end_waits=end_waits(cfg, flavor_pools(cfg)), image=image.ref if image else None),
                  pulumi.ResourceOptions(provider=target, depends_on=[operator] if operator else None)) \
        if cfg.kueue.install and cluster is not None else None
    # The custom metrics API for servers that scale on vLLM's queue: one adapter per cluster (its HPAs need not wait
    # for it: they read no metric until it answers, and then scale).
    if cluster is not None and serving_metrics.needs_adapter(cfg):
        MetricsAdapter("metrics-adapter", MetricsAdapterArgs(
            project=cfg.project, identity_pool_ready=[cluster.cluster]), on_target)
    # One Cloud Monitoring dashboard of the vLLM servers' queue, batch, KV cache and latencies (what GMP scrapes).
    if cluster is not None and (scraped_servers := dashboards.scraped_servers(cfg)):
        dashboards.ServingDashboard("serving-dashboard", dashboards.ServingDashboardArgs(
            project=cfg.project, stack=pulumi.get_stack(), servers=scraped_servers))
    # NCCL tests: bus bandwidth across a fabric pool's nodes, once its pools, fabric and image read grant exist; the
    # first thing on their pools: what would compete with one for its nodes waits for its Job to complete
    # (workloads/first_up.py).
    nccl_tests: dict[str, NcclTest] = {}
    for name, t in (sorted(cfg.nccl_tests.items()) if cluster else []):
        waits_for = [r for p in t.pools for r in (pools.get(p), gpu_fabrics.get(p)) if r] + [registry.reader] + [
            nccl_tests[before].job for before in first_up.tests_before_test(cfg, name)]
        nccl_tests[name] = NcclTest(name, NcclTestInputs(
            t, [cfg.pool(p) for p in t.pools], "", None if cfg.image.prebuilt else versions.load().nccl,
            awaited=name in first_up.awaited_tests(cfg)), image.ref,
                                    pulumi.ResourceOptions(provider=target, depends_on=waits_for))
        workload_summary[name] = nccl_tests[name].summary
    # LeaderWorkerSet: the controller a server of one replica across nodes runs on (serving.nodesPerReplica).
    lws = LeaderWorkerSetController("leader-worker-set", LeaderWorkerSetControllerArgs.pinned(), on_target) \
        if cluster is not None and group_servers(cfg) else None
    queued: dict[str, pulumi.Output[str]] = {}  # namespace of each job Kueue queues
    platform = kinds.Platform(
        cfg=cfg, image=image.ref if image else None, hf_token=cfg.hf_token, bucket=bucket, gaudi_image=gaudi_ref,
        gaudi_login=gaudi_login, claim_depends_on=[nfs] if nfs else [], own_cluster=cluster is not None,
        adopt_with=adopt_with, mpi_operator=operator, kueue=kueue.release if kueue else None, leader_worker_set=lws)
    for name, w in cfg.workloads.items():
        # Pods that pull the stack's image (nvidia, no `image` override) wait for the nodes' read grant on it.
        reader = registry.reader if registry and w.pulls_stack_image else None
        waits_for = [r for r in (pools.get(w.pool or ""), reader, gpu_fabrics.get(w.pool or ""),
                                 pools.get(w.fallback_pool or ""), classes.get(capacity.class_name(w.pool or ""))) if r]
        waits_for += [nccl_tests[t].job for t in first_up.tests_before_workload(cfg, w) if t in nccl_tests]
        # Each kind builds its own (workloads/kinds/): helm -> DeepSpeedRelease, mpijob -> TrainingJob, ...
        built = kinds.kind_of(w).build(name, w, platform, pulumi.ResourceOptions(provider=target, depends_on=waits_for))
        workload_summary[name] = built.summary
        if built.endpoint is not None:
            serving_endpoints[name] = built.endpoint
        if built.queued_namespace is not None:
            queued.setdefault(w.namespace, built.queued_namespace)
    # A LocalQueue in each queued job's namespace, once the namespace exists.
    if kueue is not None:
        for namespace, namespace_output in sorted(queued.items()):
            kueue.queue_in(namespace, namespace_output)

# 7. Vertex AI: a training identity, an optional TensorBoard and the CustomJob spec to start runs with.
vertex = None
if cfg.vertex.enabled:
    vertex = VertexTraining("vertex", VertexTrainingArgs(
        project=cfg.project, region=cfg.region, config=cfg.vertex, image_ref=image.ref,
        bucket=storage.bucket_name, repository=registry.repository.repository_id, stack=pulumi.get_stack()))

# 8. Outputs.
if cluster is not None:
    pulumi.export("clusterName", cluster.name)
    pulumi.export("clusterEndpoint", cluster.endpoint)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    if cluster.connect_gateway_kubeconfig is not None:  # cluster.fleet.enabled: the way in for CI
        pulumi.export("connectGatewayKubeconfig", cluster.connect_gateway_kubeconfig)
    pulumi.export("nodeServiceAccount", identity.email)
    pulumi.export("nodePools", {name: pool.node_pool.name for name, pool in pools.items()})
    pulumi.export("capacityPlan", capacity_plan(cfg))  # per GPU: its pools, zones, $/h; per job: its pools, who chooses
if cluster is not None or vertex is not None:  # estimated $/h: workloads running, floor, pools, Filestore, Vertex
    pulumi.export("costs", cost.stack_costs(cfg))
if image is not None:
    pulumi.export("registryUrl", registry.url)
    pulumi.export("imageRef", image.ref)
if gaudi_ref is not None:
    pulumi.export("gaudiImageRef", gaudi_ref)
if storage is not None:
    pulumi.export("bucket", storage.bucket_name)
    pulumi.export("dataServiceAccount", storage.email)
if vertex is not None:
    pulumi.export("vertexServiceAccount", vertex.account.email)
    pulumi.export("vertexCustomJob", vertex.spec)
    pulumi.export("vertexDisplayName", cfg.vertex.display_name)
if workload_summary:
    pulumi.export("workloads", workload_summary)
if recovery_plan := recovery.stack_recovery(cfg):  # checkpoint size, save time, interval
    pulumi.export("recovery", recovery_plan)
if serving_endpoints:  # in-cluster URL and the port-forward command of each `serve` workload
    pulumi.export("servingEndpoints", serving_endpoints)
