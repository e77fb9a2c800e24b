"""GPU fabrics: the contracts in data/gpu_fabric.yaml against Google's pinned manifests, and what the stack
declares for each fabric under mocks (extra VPCs, cluster, pool, objects, installers, pod contract).

Expected values are read from ../shared/reference/gke-gpu-fabric (container-engine-accelerators @ 992db81 and
cluster-toolkit @ 1047080), never copied from the code under test."""

from __future__ import annotations

import copy
import functools
import ipaddress
import re
import subprocess
import textwrap
from typing import Any

import pytest
import yaml
from conftest import reference, run_stack, stack_yaml, validate_json, yaml_load

from model import fabric
from preview.engine import RunResult

CEA = ("gke-gpu-fabric", "container-engine-accelerators")
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"


def manifest(path: str) -> list[dict[str, Any]]:
    return copy.deepcopy(_manifest(path))


@functools.cache
def _manifest(path: str) -> list[dict[str, Any]]:
    """Parsed once (with libyaml when there): some tests read the same reference manifest for every fabric."""
    with open(reference(*CEA, *path.split("/")), encoding="utf-8") as fh:
        return [d for d in yaml.load_all(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]


def first(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def test_pod_reference(path: str) -> dict[str, Any]:
    return first(manifest(path), "Pod")


test_pod_reference.__test__ = False  # a helper, not a test


TEST_MANIFEST = {"tcpx": "gpudirect-tcpx/nccl-test-latest.yaml", "tcpxo": "gpudirect-tcpxo/nccl-test-latest.yaml",
                 "rdma": "gpudirect-rdma/nccl-test.yaml"}


# --- the contracts against the pinned manifests ---------------------------------------------------

@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_installer_image_and_affinity_match_the_pinned_manifest(name: str) -> None:
    f = fabric.load().fabrics[name]
    ds = first(manifest(f.installer.manifest), "DaemonSet")
    assert ds["metadata"]["name"] == f.installer.daemon_set
    spec = ds["spec"]["template"]["spec"]
    images = [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]
    assert f.installer.image in images
    # The DaemonSet lands on exactly the accelerators this contract covers.
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    accelerators = {v for t in terms for e in t["matchExpressions"] for v in e["values"]}
    assert accelerators == set(f.machine_types.values())


def test_installer_urls_are_pinned_by_commit() -> None:
    cat = fabric.load()
    assert len(cat.manifest_commit) == 40
    for f in cat.fabrics.values():
        url = cat.url(f.installer.manifest)
        assert url.startswith("https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/")
        assert f"/{cat.manifest_commit}/" in url


def test_nri_injector_image_matches_the_pinned_manifest() -> None:
    cat = fabric.load()
    ds = first(manifest(cat.nri_manifest), "DaemonSet")
    assert cat.nri_image in [c["image"] for c in ds["spec"]["template"]["spec"]["containers"]]
    assert [n for n, f in cat.fabrics.items() if f.nri] == ["tcpx", "tcpxo"]


@pytest.mark.parametrize("name", ["tcpx", "tcpxo"])
def test_daemon_matches_the_pinned_test_pod(name: str) -> None:
    f = fabric.load().fabrics[name]
    pod = test_pod_reference(TEST_MANIFEST[name])
    daemon = next(c for c in pod["spec"]["containers"] if c["name"] == f.daemon.name)
    assert daemon["image"] == f.daemon.image
    assert tuple(daemon.get("command", []) + daemon.get("args", [])) == f.daemon.command
    assert tuple(daemon["securityContext"]["capabilities"]["add"]) == f.daemon.capabilities
    devices = yaml.safe_load(pod["metadata"]["annotations"][f"devices.gke.io/container.{f.daemon.name}"])
    assert tuple(d["path"] for d in devices) == f.daemon.devices


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_interfaces_and_volumes_match_the_pinned_test_pod(name: str) -> None:
    f = fabric.load().fabrics[name]
    pod = test_pod_reference(TEST_MANIFEST[name])
    interfaces = yaml.safe_load(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert interfaces[0] == {"interfaceName": "eth0", "network": "default"}
    assert {i["interfaceName"]: i["network"] for i in interfaces[1:]} == f.pod_interfaces
    host_paths = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    assert {v.host_path for v in f.host_volumes} == host_paths
    app = next(c for c in pod["spec"]["containers"] if c["name"] in ("nccl-test", "test"))
    by_name = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = {by_name[m["name"]]["hostPath"]["path"]: m["mountPath"] for m in app["volumeMounts"]
               if "hostPath" in by_name[m["name"]]}
    # One deliberate deviation, written in the data file: TCPX's socket directory stays at /run/tcpx, not /tmp.
    reference_paths = {v.host_path: v.raw_mount_path or v.mount_path for v in f.host_volumes if v.app}
    assert reference_paths == mounted
    assert {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"} in app["env"]


def test_rdma_contract_matches_the_pinned_manifests() -> None:
    f = fabric.load().fabrics["rdma"]
    pod = test_pod_reference(TEST_MANIFEST["rdma"])
    shm = next(v for v in pod["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    assert shm["emptyDir"]["sizeLimit"] == f.shm_size
    assert f"source {f.nccl_profile}" in pod["spec"]["containers"][0]["args"][0]
    assert pod["spec"]["containers"][0]["image"] == f.nccl_test.image
    # The RoCE VPC carries the 8 RDMA NICs the pod names; the gVNIC VPC comes first.
    assert [v.device_mode for v in f.vpcs] == ["NetDevice", "RDMA"]
    assert f.vpcs[1].nics == tuple(f.pod_interfaces.values())
    assert f.vpcs[1].network_profile == "{zone}-vpc-roce"


def test_tcpxo_env_matches_the_pinned_test_pod() -> None:
    f = fabric.load().fabrics["tcpxo"]
    app = next(c for c in test_pod_reference(TEST_MANIFEST["tcpxo"])["spec"]["containers"] if c["name"] == "nccl-test")
    for env in app["env"]:
        if env["name"] != "LD_LIBRARY_PATH":
            assert f.nccl_env[env["name"]] == env["value"]
    assert app["image"] == f.installer.image == f.nccl_test.image
    assert f.nccl_profile == f"{f.nccl_env['NCCL_LIB_DIR']}/nccl-env-profile.sh"  # CEA gpudirect-tcpxo/README.md


def tcpx_reference_env() -> dict[str, str]:
    """The `-x NAME=VALUE` list of run-nccl.sh in CEA gpudirect-tcpx/nccl-config.yaml (the GKE 1.34+ config of
    commit 0e5609b), without LD_LIBRARY_PATH (the pod contract sets it on its own)."""
    config = first(manifest("gpudirect-tcpx/nccl-config.yaml"), "ConfigMap")
    found = re.findall(r"-x (NCCL_\w+)=(\"[^\"]*\"|\S+)", config["data"]["run-nccl.sh"])
    return {name: value.strip('"') for name, value in found}




def test_tcpx_env_is_googles_gke_134_config() -> None:
    ours = dict(fabric.load().fabrics["tcpx"].nccl_env)
    # The one addition, written in the data file: the socket directory's mount path (the manifest mounts /tmp).
    assert ours.pop("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX") == "/run/tcpx"
    reference_env = tcpx_reference_env()
    assert reference_env["NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS"] == "500000"
    assert "NCCL_MIN_NCHANNELS" not in reference_env and "NCCL_MAX_NCHANNELS" not in reference_env
    assert ours == reference_env


def test_nic_counts_mtus_and_ssds_per_family() -> None:
    # FACTS.md section 1 (CT examples and modules; BW for bandwidth).
    fabrics = fabric.load().fabrics
    expected = {"tcpx": (4, 8244, 16, 1000), "tcpxo": (8, 8244, 16, 1800), "rdma": (9, 8896, 32, 3600)}
    assert {n: (len(f.nics), f.mtu, f.local_ssds, f.max_bandwidth_gbps) for n, f in fabrics.items()} == expected
    assert fabric.load().for_machine("a4-highgpu-8g").name == "rdma"
    assert fabric.load().for_machine("a3-highgpu-4g") is None  # only the 8-GPU shapes have the fabric


@pytest.mark.parametrize(("version", "ok"), [
    ("1.32.11-gke.1174000", True), ("1.32.11-gke.1173999", False), ("1.32.10-gke.9999999", False),
    ("1.32", True), ("1.33.1-gke.100", True), ("1.27.16-gke.2874000", False), ("1.31.14-gke.1243000", True),
])
def test_tcpxo_minimum_versions(version: str, ok: bool) -> None:
    # CT gpu_direct.tf: TCPXO from 1.28.15-gke.3163000, ..., 1.32.11-gke.1174000 (oldest patch per minor).
    assert fabric.meets_minimum(version, fabric.load().fabrics["tcpxo"].min_gke_versions) is ok


# --- the stack under mocks: one run per fabric ----------------------------------------------------

def _pool(machine: str, gpu: str, zone: str) -> dict[str, Any]:
    pool = dict(stack_yaml("h100")["deepspeed-stack:nodePools"][0])
    pool.update(machineType=machine, gpu={**pool["gpu"], "type": gpu}, zones=[zone])
    return pool


HELM = {"kind": "helm", "pool": "h100", "workers": 2, "namespace": "fabric-helm",
        "launch": {"script": "smoke_train.py", "args": ["--expected-gpus-per-node", "8"]},
        "deepspeed": {"zeroStage": 2, "precision": "bf16", "microBatchPerGpu": 1, "gradientAccumulation": 1}}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> dict[str, RunResult]:
    from conftest import stack_run

    return {
        "tcpxo": stack_run("h100"),
        # TCPX also runs the smoke test as a Helm release (2 workers + the client: 3 nodes, beside the MPIJob's 2).
        "tcpx": run_stack("h100", {"deepspeed-stack:nodePools": [
            {**_pool("a3-highgpu-8g", "nvidia-h100-80gb", "us-central1-a"), "maxNodes": 5}],
            "deepspeed-stack:workloads": {**stack_yaml("h100")["deepspeed-stack:workloads"], "helm-smoke": HELM}}),
        # RDMA also asks for COMPACT placement (one zone).
        "rdma": run_stack("h100", {"deepspeed-stack:nodePools": [
            # A3 Ultra boots only from Hyperdisk (data/gpu_catalog.yaml machineDisks).
            {**_pool("a3-ultragpu-8g", "nvidia-h200-141gb", "us-central1-b"), "localSsdCount": 32,
             "compactPlacement": True, "diskType": "hyperdisk-balanced"}],
            "deepspeed-stack:cluster": {**stack_yaml("h100")["deepspeed-stack:cluster"],
                                        "minMasterVersion": "1.33"}}),
    }


def _fabric_networks(run: RunResult) -> list:
    return [n for n in run.by_type(NETWORK) if n.name.startswith("fabric-")]


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_extra_vpcs_at_the_contract_mtu(runs: dict[str, RunResult], name: str) -> None:
    f = fabric.load().fabrics[name]
    run = runs[name]
    nets = _fabric_networks(run)
    assert len(nets) == len(f.vpcs)
    assert {n.inputs["mtu"] for n in nets} == {f.mtu}
    assert all(n.inputs["autoCreateSubnetworks"] is False for n in nets)
    subnets = [s for s in run.by_type(SUBNET) if s.name.startswith("fabric-")]
    assert len(subnets) == len(f.nics)
    cidrs = [ipaddress.IPv4Network(s.inputs["ipCidrRange"]) for s in subnets]
    assert all(c.prefixlen == 24 and c.subnet_of(ipaddress.IPv4Network("192.168.0.0/16")) for c in cidrs)
    assert len(set(cidrs)) == len(cidrs)
    assert {s.inputs["region"] for s in subnets} == {"us-central1"}


def test_primary_vpc_mtu_follows_the_fabric(runs: dict[str, RunResult]) -> None:
    primary = {name: run.one(NETWORK, "network-vpc").inputs.get("mtu") for name, run in runs.items()}
    # CT @ 1047080: examples/gke-a3-highgpu and gke-a3-megagpu set mtu 8244 on the primary VPC; gke-a3-ultragpu
    # and gke-a4 leave modules/network/vpc at its default, 8896 (modules/network/vpc/variables.tf).
    assert primary == {"tcpx": 8244, "tcpxo": 8244, "rdma": 8896}


@pytest.mark.parametrize("name", ["tcpx", "tcpxo"])
def test_gvnic_vpcs_allow_internal_traffic(runs: dict[str, RunResult], name: str) -> None:
    rules = [r for r in runs[name].by_type(FIREWALL) if r.name.startswith("fabric-")]
    assert len(rules) == len(fabric.load().fabrics[name].vpcs)
    for rule in rules:
        assert rule.inputs["sourceRanges"] == ["192.168.0.0/16"]
        assert sorted(a["protocol"] for a in rule.inputs["allows"]) == ["icmp", "tcp", "udp"]


def test_roce_vpc_has_the_zonal_profile_and_no_firewall_rules(runs: dict[str, RunResult]) -> None:
    run = runs["rdma"]
    nets = {n.name: n for n in _fabric_networks(run)}
    roce = nets["fabric-rdma-us-central1-b-rdma"].inputs
    assert roce["networkProfile"] == "projects/my-gcp-project/global/networkProfiles/us-central1-b-vpc-roce"
    assert "networkProfile" not in nets["fabric-rdma-us-central1-b-gvnic-1"].inputs
    rules = [r for r in run.by_type(FIREWALL) if r.name.startswith("fabric-")]
    assert [r.name for r in rules] == ["fabric-rdma-us-central1-b-gvnic-1-internal"]
    roce_urn = nets["fabric-rdma-us-central1-b-rdma"].urn
    assert all(roce_urn not in r.dependencies for r in run.by_type(FIREWALL))
    roce_subnets = [s for s in run.by_type(SUBNET) if s.name.startswith("fabric-rdma-us-central1-b-rdma-")]
    assert len(roce_subnets) == 8


def test_stacks_without_a_fabric_get_no_extra_networks(dev: RunResult) -> None:
    assert _fabric_networks(dev) == []
    assert "mtu" not in dev.one(NETWORK, "network-vpc").inputs


# --- cluster, pool, objects and installers --------------------------------------------------------

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
PARAM_SET = "kubernetes:networking.gke.io/v1:GKENetworkParamSet"
K8S_NETWORK = "kubernetes:networking.gke.io/v1:Network"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_cluster_has_multi_networking_on_dataplane_v2_and_dcgm(runs: dict[str, RunResult], name: str) -> None:
    c = runs[name].one(CLUSTER).inputs
    assert c["enableMultiNetworking"] is True
    assert c["datapathProvider"] == "ADVANCED_DATAPATH"
    # FACTS.md section 4: DCGM component with Managed Prometheus (CT gke-cluster/main.tf).
    assert "DCGM" in c["monitoringConfig"]["enableComponents"]
    assert c["monitoringConfig"]["managedPrometheus"] == {"enabled": True}


def test_cluster_without_fabric_has_no_multi_networking(dev: RunResult) -> None:
    assert "enableMultiNetworking" not in dev.one(CLUSTER).inputs


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_pool_attaches_the_fabric_nics_in_contract_order(runs: dict[str, RunResult], name: str) -> None:
    f = fabric.load().fabrics[name]
    run = runs[name]
    pool = run.one(NODE_POOL, "h100").inputs
    extra = pool["networkConfig"]["additionalNodeNetworkConfigs"]
    subnets = {s.physical_name or s.inputs.get("name"): s for s in run.by_type(SUBNET)}
    assert len(extra) == len(f.nics)
    # Each NIC's subnet is the one made for that NIC, in the contract's order (gVNIC first, then RDMA).
    assert [subnets[e["subnetwork"]].name for e in extra] == [
        n for n in (s.name for s in run.by_type(SUBNET)) if n.startswith("fabric-")]
    node = pool["nodeConfig"]
    assert node["gvnic"] == {"enabled": True}
    assert node["ephemeralStorageLocalSsdConfig"]["localSsdCount"] == f.local_ssds
    assert node["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert node["guestAccelerators"][0]["count"] == 8
    assert pool.get("placementPolicy") == ({"type": "COMPACT"} if name == "rdma" else None)


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_one_param_set_and_network_per_nic(runs: dict[str, RunResult], name: str) -> None:
    f = fabric.load().fabrics[name]
    run = runs[name]
    params = {p.inputs["metadata"]["name"]: p.inputs for p in run.by_type(PARAM_SET)}
    networks = {n.inputs["metadata"]["name"]: n.inputs for n in run.by_type(K8S_NETWORK)}
    assert list(params) == list(networks) == list(f.nics)
    modes = {nic: vpc.device_mode for vpc in f.vpcs for nic in vpc.nics}
    vpc_names = {n.physical_name for n in _fabric_networks(run)}
    for nic, p in params.items():
        assert p["apiVersion"] == "networking.gke.io/v1"
        assert set(p["spec"]) == {"vpc", "vpcSubnet", "deviceMode"}
        assert p["spec"]["deviceMode"] == modes[nic]
        assert p["spec"]["vpc"] in vpc_names
        assert networks[nic]["spec"] == {"type": "Device", "parametersRef": {
            "group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": nic}}
    # Pods name these networks: every interface of the pinned test pod has its Network.
    pod = test_pod_reference(TEST_MANIFEST[name])
    named = {i["network"] for i in yaml.safe_load(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])}
    assert named - {"default"} <= set(networks)


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_installers_applied_from_the_pinned_commit(runs: dict[str, RunResult], name: str) -> None:
    cat = fabric.load()
    files = sorted(c.inputs["file"] for c in runs[name].by_type(CONFIG_FILE) if "container-engine" in c.inputs["file"])
    f = cat.fabrics[name]
    paths = {"tcpx": ["gpudirect-tcpx/nccl-tcpx-installer.yaml", "nri_device_injector/nri-device-injector.yaml"],
             "tcpxo": ["gpudirect-tcpxo/nccl-tcpxo-installer.yaml", "nri_device_injector/nri-device-injector.yaml"],
             "rdma": ["gpudirect-rdma/nccl-rdma-installer.yaml"]}[name]
    base = ("https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/"
            "992db81257553607f1477945f1b3219632991829/")
    assert files == sorted(base + p for p in paths)
    assert f.installer.manifest == paths[0]
    for p in paths:  # the pinned path is a file of the reference snapshot
        assert manifest(p)


def test_workloads_wait_for_the_fabric(runs: dict[str, RunResult]) -> None:
    run = runs["tcpxo"]
    parts = [r.urn for r in run.by_type(K8S_NETWORK) + run.by_type(CONFIG_FILE) if "GpuFabric" in r.urn]
    job = run.one("deepspeed-stack:workloads:TrainingJob")
    assert len(parts) == 10  # 8 Networks, the installer and the NRI injector
    assert set(parts) <= set(job.dependencies)


# --- the pod contract ------------------------------------------------------------------------------

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def _worker(run: RunResult) -> dict[str, Any]:
    return run.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Worker"]["template"]


def _app_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] in ("nccl-test", "test"))


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_worker_gets_the_interfaces_of_the_pinned_pod(runs: dict[str, RunResult], name: str) -> None:
    ref = test_pod_reference(TEST_MANIFEST[name])["metadata"]["annotations"]
    ours = _worker(runs[name])["metadata"]["annotations"]
    key = "networking.gke.io/interfaces"
    assert yaml.safe_load(ours[key]) == yaml.safe_load(ref[key])
    assert ours["networking.gke.io/default-interface"] == ref["networking.gke.io/default-interface"]


@pytest.mark.parametrize("name", ["tcpx", "tcpxo"])
def test_rxdm_daemon_is_a_native_sidecar_like_the_pinned_pod(runs: dict[str, RunResult], name: str) -> None:
    ref = test_pod_reference(TEST_MANIFEST[name])
    ref_daemon = ref["spec"]["containers"][0]
    worker = _worker(runs[name])
    (daemon,) = worker["spec"]["initContainers"]
    assert daemon["name"] == ref_daemon["name"]
    assert daemon["image"] == ref_daemon["image"]
    assert daemon["command"] == ref_daemon.get("command", []) + ref_daemon.get("args", [])
    assert daemon["restartPolicy"] == "Always"  # native sidecar (CEA gpudirect-tcpxo/best-practice.md)
    assert daemon["securityContext"]["capabilities"]["add"] == ref_daemon["securityContext"]["capabilities"]["add"]
    assert "privileged" not in daemon["securityContext"]
    ref_vols = {v["name"]: v["hostPath"]["path"] for v in ref["spec"]["volumes"] if "hostPath" in v}
    our_vols = {v["name"]: v["hostPath"]["path"] for v in worker["spec"]["volumes"] if "hostPath" in v}
    assert {ref_vols[m["name"]]: m["mountPath"] for m in ref_daemon["volumeMounts"]} == {
        our_vols[m["name"]]: m["mountPath"] for m in daemon["volumeMounts"]}
    device_key = f"devices.gke.io/container.{ref_daemon['name']}"
    assert yaml.safe_load(worker["metadata"]["annotations"][device_key]) == yaml.safe_load(
        ref["metadata"]["annotations"][device_key])


def best_practice_probe() -> dict[str, Any]:
    """The tcpxo-daemon example of CEA gpudirect-tcpxo/best-practice.md, "Setup Startup Probe for the
    TCPXO-daemon Sidecar" (a list item in a Markdown code block: made a mapping, then parsed)."""
    text = reference(*CEA, "gpudirect-tcpxo", "best-practice.md").read_text(encoding="utf-8")
    block = text.split("An example of startup probe:", 1)[1].split("```", 2)[1]
    return yaml.safe_load(textwrap.dedent(block.replace("- name: tcpxo-daemon", "name: tcpxo-daemon", 1)))


def test_tcpxo_daemon_gets_googles_startup_probe(runs: dict[str, RunResult]) -> None:
    ref = best_practice_probe()
    (daemon,) = _worker(runs["tcpxo"])["spec"]["initContainers"]
    assert daemon["startupProbe"] == ref["startupProbe"]
    assert {"name": "HEALTH_CHECK_LOG_FILE", "value": "/run/health-check"} in ref["env"]
    assert [e for e in daemon["env"] if e["name"] == "HEALTH_CHECK_LOG_FILE"] == [
        e for e in ref["env"] if e["name"] == "HEALTH_CHECK_LOG_FILE"]
    assert "_" not in ref["startupProbe"]["exec"]["command"][1]  # the doc: the file name has no low line
    # The TCPX daemon (another image) has no such health-check file in any pinned source: no probe there.
    (tcpx_daemon,) = _worker(runs["tcpx"])["spec"]["initContainers"]
    assert "startupProbe" not in tcpx_daemon


def _rank_script(tmp_path: Any, devices: list[str]) -> subprocess.CompletedProcess[str]:
    import msgspec

    from workloads import fabric as pod_fabric

    (tmp_path / "infiniband").mkdir()
    for name in devices:
        (tmp_path / "infiniband" / name).write_text("")
    rdma = msgspec.structs.replace(fabric.load().fabrics["rdma"], rank_devices=str(tmp_path / "infiniband"),
                               nccl_profile="")
    script = tmp_path / "nccl_env.sh"
    script.write_text(pod_fabric.env_script(rdma), encoding="utf-8")
    return subprocess.run(["bash", str(script), "echo", "rank-started"], capture_output=True, text=True, timeout=20)


def test_an_rdma_rank_without_verbs_devices_stops_with_the_reason(tmp_path: Any) -> None:
    proc = _rank_script(tmp_path, [])
    assert proc.returncode == 1 and proc.stdout == ""
    assert "infiniband/uverbs* in this pod" in proc.stderr and "networking.gke.io/interfaces" in proc.stderr


def test_an_rdma_rank_with_its_devices_starts(tmp_path: Any) -> None:
    proc = _rank_script(tmp_path, ["uverbs0", "uverbs1"])
    assert (proc.returncode, proc.stdout) == (0, "rank-started\n"), proc.stderr


def test_rdma_ranks_raise_their_locked_memory_and_tcpx_ranks_do_not() -> None:
    from workloads import fabric as pod_fabric

    rdma = pod_fabric.env_script(fabric.load().fabrics["rdma"])
    assert 'ulimit -S -l "$(ulimit -H -l)"' in rdma
    assert rdma.index("ulimit") < rdma.index(". /usr/local/gib/scripts/set_nccl_env.sh") < rdma.index('exec "$@"')
    assert "ulimit" not in pod_fabric.env_script(fabric.load().fabrics["tcpx"])


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_training_container_gets_libraries_env_and_shm(runs: dict[str, RunResult], name: str) -> None:
    ref = test_pod_reference(TEST_MANIFEST[name])
    ref_app = _app_container(ref)
    worker = _worker(runs[name])
    (app,) = worker["spec"]["containers"]
    ref_vols = {v["name"]: v for v in ref["spec"]["volumes"]}
    our_vols = {v["name"]: v for v in worker["spec"]["volumes"]}
    env = {e["name"]: e["value"] for e in app["env"]}

    def host_mounts(container: dict[str, Any], vols: dict[str, Any]) -> dict[str, str]:
        return {vols[m["name"]]["hostPath"]["path"]: m["mountPath"] for m in container["volumeMounts"]
                if "hostPath" in vols[m["name"]]}

    ours = host_mounts(app, our_vols)
    if name == "tcpx":  # the socket directory's deviation from the manifest (data/gpu_fabric.yaml says why)
        assert ours.pop("/run/tcpx") == env["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == "/run/tcpx"
        assert host_mounts(ref_app, ref_vols).pop("/run/tcpx") == "/tmp"
        ours["/run/tcpx"] = "/tmp"
    assert ours == host_mounts(ref_app, ref_vols)
    for e in ref_app["env"]:
        assert env[e["name"]] == e["value"]
    shm = next(our_vols[m["name"]] for m in app["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    if name == "rdma":  # the RDMA manifest sizes /dev/shm for 8 GPUs
        ref_shm = next(ref_vols[m["name"]] for m in ref_app["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert shm["emptyDir"]["sizeLimit"] == ref_shm["emptyDir"]["sizeLimit"]
    assert "initContainers" not in worker["spec"] or name != "rdma"


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_every_rank_sources_the_fabric_env(runs: dict[str, RunResult], name: str) -> None:
    run = runs[name]
    data = next(c.inputs["data"] for c in run.by_type(CONFIG_MAP) if "nccl_env.sh" in c.inputs.get("data", {}))
    script = data["nccl_env.sh"]
    launcher = run.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "--no_python --no_local_rank /bin/bash /etc/deepspeed/nccl_env.sh" in launcher["args"][0]
    assert script.rstrip().endswith('exec "$@"')
    if name == "rdma":  # CEA gpudirect-rdma/nccl-test.yaml: `source /usr/local/gib/scripts/set_nccl_env.sh`
        ref_args = _app_container(test_pod_reference(TEST_MANIFEST["rdma"]))["args"][0]
        profile = next(line.split()[1] for line in ref_args.splitlines() if line.startswith("source "))
        assert f". {profile}" in script
        assert "export NCCL_NET=gIB" in script
    if name == "tcpxo":  # CEA gpudirect-tcpxo/README.md: source ${NCCL_LIB_DIR}/nccl-env-profile.sh
        assert "export NCCL_LIB_DIR=/usr/local/nvidia/lib64" in script
        assert script.index("NCCL_LIB_DIR") < script.index(". /usr/local/nvidia/lib64/nccl-env-profile.sh")
    if name == "tcpx":  # FACTS.md: the TCPX NCCL variables of CEA gpudirect-tcpx/nccl-config.yaml
        assert "export NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=eth1,eth2,eth3,eth4" in script
        assert "export NCCL_GPUDIRECTTCPX_CTRL_DEV=eth0" in script


def test_pods_off_a_fabric_are_unchanged(dev: RunResult) -> None:
    values = dev.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    worker = values["worker"]
    assert "networking.gke.io/interfaces" not in worker["podAnnotations"]
    assert "initContainers" not in worker
    assert "--no_python" not in values["source"]["launchCommand"]


@pytest.mark.parametrize("name", ["tcpx", "tcpxo", "rdma"])
def test_fabric_worker_pod_is_a_valid_pod(runs: dict[str, RunResult], name: str) -> None:
    import kubernetes_validate

    template = _worker(runs[name])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", **template["metadata"]},
           "spec": template["spec"]}
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    for reg in runs[name].by_type(CONFIG_MAP):
        obj = {k: v for k, v in reg.inputs.items() if k in ("apiVersion", "kind", "metadata", "data")}
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_helm_release_on_a_fabric_pool_gets_the_contract(runs: dict[str, RunResult]) -> None:
    run = runs["tcpx"]
    values = run.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    f = fabric.load().fabrics["tcpx"]
    worker, client = values["worker"], values["client"]
    ref = test_pod_reference(TEST_MANIFEST["tcpx"])
    assert yaml.safe_load(worker["podAnnotations"]["networking.gke.io/interfaces"]) == yaml.safe_load(
        ref["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [c["image"] for c in worker["initContainers"]] == [ref["spec"]["containers"][0]["image"]]
    assert {v["hostPath"]["path"] for v in worker["extraVolumes"] if "hostPath" in v} == {
        v["hostPath"]["path"] for v in ref["spec"]["volumes"] if "hostPath" in v}
    assert {e["name"] for e in client["extraEnvVars"]} >= {"LD_LIBRARY_PATH", *f.nccl_env}
    assert "initContainers" not in client
    assert "--no_python --no_local_rank /bin/bash /app/nccl_env.sh" in values["source"]["launchCommand"]
    source = next(c for c in run.by_type(CONFIG_MAP) if c.name == "helm-smoke-source")
    assert "export NCCL_GPUDIRECTTCPX_CTRL_DEV=eth0" in source.inputs["data"]["nccl_env.sh"]


# --- rules: a broken fabric plan is refused before anything is created ----------------------------

def _problems(changes: dict[str, Any]) -> list[str]:
    from conftest import problems

    return problems("h100", changes)


def _rdma_pool(zones: list[str]) -> dict[str, Any]:
    return {**_pool("a3-ultragpu-8g", "nvidia-h200-141gb", zones[0] if zones else "us-central1-b"), "zones": zones,
            "diskType": "hyperdisk-balanced", "localSsdCount": 32,  # what A3 Ultra comes with and boots from
            "name": "h200"}


def test_the_h100_stack_passes_every_fabric_rule() -> None:
    assert _problems({}) == []


def test_multi_networking_off_is_refused() -> None:
    found = _problems({"cluster.multiNetworking": False})
    assert len(found) == 1 and found[0].startswith("cluster.multiNetworking: is off, but pool(s) h100")


def test_fabric_without_dataplane_v2_is_refused() -> None:
    found = _problems({"cluster.dataplaneV2": False})
    assert any(p.startswith("cluster.dataplaneV2: GKE multi-networking") for p in found)


def test_fewer_additional_networks_than_nics_is_refused() -> None:
    (found,) = _problems({"nodePools[0].fabric.additionalNetworks": 4})
    assert found.startswith("nodePools[0].fabric.additionalNetworks: 4 is fewer than the 8 extra NICs")
    assert _problems({"nodePools[0].fabric.additionalNetworks": 8}) == []


def test_fabric_pool_without_its_installer_is_refused() -> None:
    (found,) = _problems({"nodePools[0].fabric.installer": False})
    assert found.startswith("nodePools[0].fabric.installer: pool h100 (GPUDirect-TCPXO) needs the "
                            "nccl-tcpxo-installer DaemonSet")
    # Turning the fabric off is the way out for single-node work: then no rule asks for it.
    assert _problems({"nodePools[0].fabric.installer": False, "nodePools[0].fabric.enabled": False,
                      "ncclTests": {}}) == []


def test_one_job_across_pools_of_different_fabrics_is_refused() -> None:
    pools = [stack_yaml("h100")["deepspeed-stack:nodePools"][0], _rdma_pool(["us-central1-b"])]
    found = _problems({"nodePools": pools, "ncclTests": {"bw": {"pools": ["h100", "h200"]}}})
    assert found == ["ncclTests.bw.pools: one job across pools of different fabrics (h100: tcpxo, h200: rdma); "
                     "NCCL runs one transport per job, so use pools of one fabric"]
    assert _problems({"nodePools": pools, "ncclTests": {"bw": {"pools": ["h200"]}}}) == []


def test_nccl_test_needs_fabric_pools_and_enough_nodes() -> None:
    (found,) = _problems({"ncclTests": {"bw": {"pools": ["h100"], "nodes": 3}}})
    assert found.startswith("ncclTests.bw.nodes: 3 nodes, but the pools reach at most 2")
    (found,) = _problems({"nodePools[0].fabric.enabled": False, "ncclTests": {"bw": {"pools": ["h100"]}}})
    assert found.startswith("ncclTests.bw.pools: h100 has no GPU fabric")


def test_compact_placement_across_zones_is_refused() -> None:
    (found,) = _problems({"nodePools[0].compactPlacement": True, "nodePools[0].zones": []})
    # The catalog offers a3-megagpu-8g in three us-central1 zones (its zone source's a3-megagpu-8g and H100-MEGA
    # rows agree on a, b and c); an empty list means all three.
    assert found.startswith("nodePools[0].compactPlacement: COMPACT placement works in one zone, but pool h100 "
                            "spans 3 (us-central1-a, us-central1-b, us-central1-c)")
    assert _problems({"nodePools[0].compactPlacement": True}) == []


def test_gke_version_below_the_minimum_is_refused() -> None:
    # CT gpu_direct.tf: TCPXO on 1.32 needs 1.32.11-gke.1174000. Below 1.33 the image's driver is refused as well
    # (GKE's LATEST there is R570: tests/test_driver.py); only the fabric's rule is looked at here.
    def fabric_rule(changes: dict) -> list[str]:
        return [p for p in _problems(changes) if "R580" not in p]

    (found,) = fabric_rule({"cluster.minMasterVersion": "1.32.11-gke.1000000"})
    assert found.startswith("cluster.minMasterVersion: 1.32.11-gke.1000000 is below what GPUDirect-TCPXO (A3 Mega)")
    assert fabric_rule({"cluster.minMasterVersion": "1.32.11-gke.1174000"}) == []
    (found,) = fabric_rule({"cluster.minMasterVersion": "1.28.15-gke.3163000"})
    assert "native sidecar" in found


def test_rdma_pool_spans_one_zone() -> None:
    # The catalog has H200 in one us-central1 zone only, so the second zone is refused by the zone rule too.
    found = _problems({"nodePools": [_rdma_pool(["us-central1-b", "us-central1-c"])], "workloads": {}})
    assert [p for p in found if p.startswith("nodePools[0].zones:")] == [
        "nodePools[0].zones: GPUDirect RDMA (RoCEv2) with NCCL gIB needs its pool in one zone (the RoCE VPC's network "
        "profile is zonal), but h200 spans us-central1-b, us-central1-c; list one zone"]


def test_tcpx_and_tcpxo_in_one_cluster_collide() -> None:
    pools = [stack_yaml("h100")["deepspeed-stack:nodePools"][0],
             {**_pool("a3-highgpu-8g", "nvidia-h100-80gb", "us-central1-a"), "name": "h100high"}]
    (found,) = _problems({"nodePools": pools})
    assert found.startswith("nodePools: pool(s) h100high (tcpx) and tcpxo need Networks of the same names (vpc1,")


def test_fabric_cidr_must_hold_the_subnets_and_not_overlap() -> None:
    (found,) = _problems({"network.fabricCidr": "192.168.0.0/22"})
    assert found == ("network.fabricCidr: 192.168.0.0/22 holds 4 /24 subnet(s), the fabrics need 8; use a larger "
                     "range such as 192.168.0.0/16")
    (found,) = _problems({"network.fabricCidr": "10.10.0.0/16"})
    assert found.startswith("network.fabricCidr: 10.10.0.0/16 overlaps network.subnetCidr 10.10.0.0/20")


# --- the NCCL test --------------------------------------------------------------------------------

JOB = "kubernetes:batch/v1:Job"


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n (all_reduce), * (n-1)/n (all_gather, reduce_scatter).
    from recipes import nccl_bench

    assert nccl_bench.bandwidth("all_reduce", 8 * 10**9, 1.0, 16) == (8.0, 8.0 * 30 / 16)
    assert nccl_bench.bandwidth("all_gather", 8 * 10**9, 0.5, 16) == (16.0, 16.0 * 15 / 16)
    assert nccl_bench.parse_size("8Gi") == 8 * 2**30 and nccl_bench.parse_size("1M") == 10**6
    sizes = nccl_bench.sizes(2**20, 8 * 2**30, 16)
    assert sizes[0] == 2**20 and sizes[-1] == 8 * 2**30 and len(sizes) == 14
    assert all(s % (16 * 4) == 0 for s in sizes)
    with pytest.raises(SystemExit):
        nccl_bench.parse_args(["--benchmarks", "alltoall"])


@pytest.mark.parametrize(("ran", "ok", "line"), [
    ("2.29.7", True, "NCCL 2.29.7 (Google qualifies the fabric's plugin with 2.28.7, not this one)"),
    # torch 2.5.1's own nvidia-nccl-cu12 (issue 19.4): neither the image's nor new enough for the TCPXO plugin.
    ("2.21.5", False, "NCCL 2.21.5 (the image ships 2.29.7: torch loaded another libnccl.so.2 (LD_PRELOAD, or a "
                      "changed venv); the fabric's plugin needs 2.28.0 or later: NCCL would fail at init or fall back "
                      "to TCP; Google qualifies the fabric's plugin with 2.28.7, not this one)"),
    ("2.30.4", False, "NCCL 2.30.4 (the image ships 2.29.7: torch loaded another libnccl.so.2 (LD_PRELOAD, or a "
                      "changed venv); Google qualifies the fabric's plugin with 2.28.7, not this one)"),
])
def test_nccl_bench_checks_the_nccl_torch_ran(ran: str, ok: bool, line: str) -> None:
    from recipes import nccl_bench

    assert nccl_bench.check_nccl(ran, "2.29.7", "2.28.0", "2.28.7") == (ok, line)
    assert nccl_bench.check_nccl("2.28.7", None, "2.28.0", "2.28.7-1") == (
        True, "NCCL 2.28.7 (Google qualifies the fabric's plugin with 2.28.7-1)")
    assert nccl_bench.nccl_text((2, 29, 7)) == nccl_bench.nccl_text(22907) == "2.29.7"


def test_nccl_bench_fails_before_the_rendezvous_on_a_wrong_nccl(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    import types

    from recipes import nccl_bench

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 21, 5)),  # type: ignore[attr-defined]
                                      set_device=lambda _: pytest.fail("no rendezvous with a wrong NCCL"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.distributed", types.ModuleType("torch.distributed"))
    assert nccl_bench.main(["--expect-nccl", "2.29.7", "--min-nccl", "2.28.0"]) == 3
    assert capsys.readouterr().err.startswith("# nccl_bench: wrong NCCL: NCCL 2.21.5 (the image ships 2.29.7")


@pytest.fixture(scope="module")
def nccl(runs: dict[str, RunResult]) -> dict[str, Any]:
    run = runs["tcpxo"]
    return {"job": run.one(JOB).inputs, "service": run.one("kubernetes:core/v1:Service", "bandwidth-service").inputs,
            "config": run.one(CONFIG_MAP, "bandwidth-config").inputs,
            "policy": run.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "bandwidth-policy").inputs}


def test_nccl_test_is_one_indexed_job_across_the_pool(nccl: dict[str, Any]) -> None:
    job = nccl["job"]
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == nccl["service"]["metadata"]["name"] == "bandwidth"
    assert nccl["service"]["spec"]["clusterIP"] == "None"
    (app,) = pod["spec"]["containers"]
    assert app["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert app["command"] == ["/bin/bash", "/etc/nccl-test/nccl_env.sh", "/bin/bash", "/etc/nccl-test/run.sh"]
    env = {e["name"]: e["value"] for e in app["env"]}
    assert env["MASTER_ADDR"] == "bandwidth-0.bandwidth" and env["NODES"] == "2"
    data = nccl["config"]["data"]
    from workloads.nccl_test import SCRIPT

    assert data["nccl_bench.py"] == SCRIPT.read_text(encoding="utf-8")
    # The NCCL it must have run: the image's (data/versions.yaml), TCPXO's floor and Google's qualified version
    # (data/gpu_fabric.yaml; CEA gpudirect-tcpxo/README.md: "qualified and supported: NCCL 2.28.7-1").
    assert ("--benchmarks all_gather,all_reduce --min-bytes 1Mi --max-bytes 8Gi --expect-nccl 2.29.7 "
            "--min-nccl 2.28.0 --qualified-nccl 2.28.7") in data["run.sh"]
    assert "--nproc-per-node=8" in data["run.sh"]


def test_nccl_test_waits_for_its_pool_fabric_and_the_image_read_grant(runs: dict[str, RunResult]) -> None:
    # Its pods pull the stack's image: before the nodes may read the repository, the pull fails (ImagePullBackOff)
    # and the Job's pods back off; before the fabric's Networks and installer, pods start without the extra NICs.
    run = runs["tcpxo"]
    job = run.one(JOB)
    reader = run.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember", "registry-node-reader")
    pool = run.one("gcp:container/nodePool:NodePool", "h100")
    installer = run.one("kubernetes:yaml/v2:ConfigFile", "gpu-fabric-tcpxo-installer")
    assert {reader.urn, pool.urn, installer.urn} <= set(job.dependencies)


def test_nccl_test_pods_get_the_fabric_contract(nccl: dict[str, Any]) -> None:
    ref = test_pod_reference(TEST_MANIFEST["tcpxo"])
    pod = nccl["job"]["spec"]["template"]
    key = "networking.gke.io/interfaces"
    assert yaml.safe_load(pod["metadata"]["annotations"][key]) == yaml.safe_load(ref["metadata"]["annotations"][key])
    assert [c["image"] for c in pod["spec"]["initContainers"]] == [ref["spec"]["containers"][0]["image"]]
    assert {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v} == {
        v["hostPath"]["path"] for v in ref["spec"]["volumes"] if "hostPath" in v}


def test_nccl_test_objects_are_valid(nccl: dict[str, Any]) -> None:
    import kubernetes_validate

    for obj in nccl.values():
        clean = {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata", "spec", "data")}
        kubernetes_validate.validate(clean, "1.33.0", strict=True)


def test_the_readme_gives_the_reference_bandwidths() -> None:
    from conftest import user_docs

    readme = user_docs()
    for f in fabric.load().fabrics.values():
        assert f.nccl_test.reference_bus_bandwidth.split(" (")[0] in readme


def test_fabric_helm_values_fit_the_chart(runs: dict[str, RunResult]) -> None:
    """The keys the contract adds (extraEnvVars, initContainers, extraVolumes...) are the chart's own."""
    import json

    from test_deepspeed_release import _unknown_paths

    values = runs["tcpx"].one("kubernetes:helm.sh/v3:Release").inputs["values"]
    chart_values = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text())
    assert _unknown_paths(values, chart_values) == []
    validate_json(values, json.loads(reference("bitnami-deepspeed", "values.schema.json").read_text()))


def test_preview_shows_the_fabric(runs: dict[str, RunResult], dev: RunResult) -> None:
    from preview.sections.fabric import section as fabric_summary

    ((title, body),) = fabric_summary(runs["tcpxo"])
    assert title == "GPU fabric"
    assert "| h100 | a3-megagpu-8g | 8 | on | 16 | - |" in body
    assert "fabric-tcpxo`: 8 VPC(s) at MTU 8244" in body
    assert "container-engine-accelerators@992db81:gpudirect-tcpxo/nccl-tcpxo-installer.yaml" in body
    assert "multi-networking on" in body and "DCGM on" in body
    ((_, rdma),) = fabric_summary(runs["rdma"])
    assert "network profile us-central1-b-vpc-roce" in rdma and "| COMPACT |" in rdma
    assert fabric_summary(dev) == []
