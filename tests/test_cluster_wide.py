"""Rules across workloads and the cluster (issue 10, item 4), each with a failing input."""

from __future__ import annotations

import copy

from conftest import changed, config_problems


def nvidia_mpijob(**storage: str) -> dict:
    # dev's t4 pool; 1 worker x 1 GPU x micro batch 8 x 2 accumulation steps = 16.
    return {"kind": "mpijob", "namespace": "train", "pool": "t4", "workers": 1,
            "launch": {"script": "smoke_train.py"}, "storage": dict(storage),
            "deepspeed": {"zeroStage": 2, "precision": "fp16", "microBatchPerGpu": 8, "gradientAccumulation": 2,
                          "trainBatchSize": 16}}


def test_two_workloads_that_together_exceed_the_pool_are_refused() -> None:
    # dev's smoke: 2 workers (the chart's client runs on the system pool) of t4's 3 nodes; a copy needs 2 more.
    config = changed("dev")
    workloads = config["deepspeed-stack:workloads"]
    workloads["smoke2"] = {**copy.deepcopy(workloads["smoke"]), "namespace": "deepspeed-smoke2"}
    assert config_problems(config) == [
        "nodePools[0].maxNodes: the workloads on pool t4 need 4 nodes at once (smoke 2 (2 worker(s)), "
        "smoke2 2 (2 worker(s))), but maxNodes is 3; raise it to 4, or move a workload to another pool"]
    config["deepspeed-stack:nodePools"][0]["maxNodes"] = 4
    assert config_problems(config) == []


def test_an_mpijob_on_the_stacks_cluster_needs_the_operator() -> None:
    config = changed("dev", {"workloads.train": nvidia_mpijob(storageClass="standard-rwx"),
                             "nodePools[0].maxNodes": 4})
    assert config_problems(config) == [
        "mpiOperator.install: workloads.train runs as an MPIJob on this stack's new GKE cluster, which has no MPI "
        "operator (nor its kubeflow.org MPIJob CRD); set mpiOperator.install: true"]
    config["deepspeed-stack:mpiOperator"] = {"install": True}
    assert config_problems(config) == []


def test_nfs_client_on_gke_needs_the_provisioner() -> None:
    config = changed("dev", {"workloads.train": nvidia_mpijob(), "mpiOperator.install": True,
                             "nodePools[0].maxNodes": 4})
    assert config_problems(config) == [
        "workloads.train.storage.storageClass: nfs-client does not exist on GKE without the NFS provisioner; set "
        "nfsProvisioner.install: true (with nfsProvisioner.server, and nfsProvisioner.storageClass nfs-client), or "
        "use GKE's Filestore class standard-rwx"]
    config["deepspeed-stack:nfsProvisioner"] = {"install": True, "server": "10.0.0.5"}
    assert config_problems(config) == []
