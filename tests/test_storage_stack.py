"""A dev stack with the bucket, Vertex AI and GCS FUSE mounts: what it declares, and that it stays valid."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import reference, run_stack, stack_run, stack_yaml, yaml_load
from test_deepspeed_release import _unknown_paths
from test_mpijob import crd_problems, pod_problems
from test_platform import waits_for

from preview.engine import RunResult

BUCKET = "gcp:storage/bucket:Bucket"
SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "workloads/vertex_customjob.schema.json").read_text())
WI_POOL = "my-gcp-project.svc.id.goog"


def _with_data_path() -> dict[str, Any]:
    cfg = stack_yaml("dev")
    smoke = cfg["deepspeed-stack:workloads"]["smoke"]
    smoke["gcsFuse"] = {"enabled": True, "mountPath": "/data"}
    cfg["deepspeed-stack:workloads"]["train"] = {
        "kind": "mpijob", "pool": "t4", "workers": 1, "namespace": "train", "launch": smoke["launch"],
        # The same DeepSpeed settings with train_batch_size computed (the helm one is for 2 workers).
        "deepspeed": {k: v for k, v in smoke.get("deepspeed", {}).items() if k != "trainBatchSize"},
        "gcsFuse": {"enabled": True}, "storage": {"storageClass": "standard-rwx"}}
    pools = cfg["deepspeed-stack:nodePools"]
    pools[0]["maxNodes"] = 4  # smoke's 3 nodes and train's 1 at once
    return {
        "deepspeed-stack:nodePools": pools,
        "deepspeed-stack:mpiOperator": {"install": True},
        "deepspeed-stack:workloads": cfg["deepspeed-stack:workloads"],
        "deepspeed-stack:storage": {"enabled": True, "checkpointRetentionDays": 14},
        "deepspeed-stack:vertex": {"enabled": True, "machineType": "n1-standard-8", "workers": 2,
                                   "tensorboard": True, "launch": {"script": "train.py", "args": ["--epochs", "1"]}},
    }


@functools.cache
def _run() -> RunResult:
    return run_stack("dev", _with_data_path())


@pytest.fixture(scope="module")
def run() -> RunResult:
    return _run()


def test_bucket_is_private_recoverable_and_tidy(run: RunResult) -> None:
    b = run.one(BUCKET).inputs
    assert b["location"] == "us-west1"
    assert b["uniformBucketLevelAccess"] is True
    assert b["publicAccessPrevention"] == "enforced"
    assert b["softDeletePolicy"] == {"retentionDurationSeconds": 7 * 24 * 3600}
    assert b["forceDestroy"] is False
    assert b["lifecycleRules"] == [{"action": {"type": "Delete"},
                                    "condition": {"age": 14, "matchesPrefixes": ["checkpoints/"]}}]
    assert b["labels"]["managed-by"] == "pulumi"


def test_the_bucket_is_protected_where_the_cluster_is(run: RunResult) -> None:
    # Data outlives a mistake: with the cluster's deletionProtection (prod) `pulumi destroy` and a replacement
    # refuse to touch the bucket; a dev stack's bucket goes with the stack. Its name is fixed: delete first.
    dev_bucket = run.one(BUCKET)
    assert (dev_bucket.protect, dev_bucket.delete_before_replace) == (False, True)
    prod_bucket = run_stack("prod", {"deepspeed-stack:storage": {"enabled": True}}).one(BUCKET)
    assert (prod_bucket.protect, prod_bucket.delete_before_replace) == (True, True)


def test_object_access_on_the_bucket_only(run: RunResult) -> None:
    grants = {r.name: r.inputs for r in run.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    data_sa = "ds-data-dev@my-gcp-project.iam.gserviceaccount.com"
    vertex_sa = "ds-vertex-dev@my-gcp-project.iam.gserviceaccount.com"
    assert {(g["role"], g["member"]) for g in grants.values()} == {
        ("roles/storage.objectUser", f"serviceAccount:{data_sa}"),
        ("roles/storage.objectUser", f"serviceAccount:{vertex_sa}")}
    project_roles = {r.inputs["member"] for r in run.by_type("gcp:projects/iAMMember:IAMMember")
                     if "storage" in r.inputs["role"]}
    assert project_roles == set()  # never a project-wide storage role


def test_workload_identity_binds_each_mounting_namespace(run: RunResult) -> None:
    bindings = sorted(r.inputs["member"] for r in run.by_type("gcp:serviceaccount/iAMMember:IAMMember"))
    smoke_ns = stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"].get("namespace", "workloads")
    assert bindings == sorted([f"serviceAccount:{WI_POOL}[{smoke_ns}/deepspeed-data]",
                               f"serviceAccount:{WI_POOL}[train/deepspeed-data]"])
    for r in run.by_type("gcp:serviceaccount/iAMMember:IAMMember"):
        assert r.inputs["role"] == "roles/iam.workloadIdentityUser"


def test_kubernetes_service_accounts_carry_the_google_account(run: RunResult) -> None:
    ksas = run.by_type("kubernetes:core/v1:ServiceAccount")
    assert len(ksas) == 2
    for ksa in ksas:
        assert ksa.inputs["metadata"]["name"] == "deepspeed-data"
        assert ksa.inputs["metadata"]["annotations"] == {
            "iam.gke.io/gcp-service-account": "ds-data-dev@my-gcp-project.iam.gserviceaccount.com"}


def _bucket_name(run: RunResult) -> str:
    return run.outputs["bucket"]


def test_helm_pods_mount_the_bucket(run: RunResult) -> None:
    values = run.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    for role in ("client", "worker"):
        pod = values[role]
        assert pod["podAnnotations"]["gke-gcsfuse/volumes"] == "true"
        assert pod["podAnnotations"]["gke-gcsfuse/cpu-request"] == "100m"  # small: the pod fills the node
        assert pod["serviceAccount"] == {"create": False, "name": "deepspeed-data"}
        (gcs,) = [v for v in pod["extraVolumes"] if v["name"] == "gcs"]
        assert gcs["csi"] == {"driver": "gcsfuse.csi.storage.gke.io",
                              "volumeAttributes": {"bucketName": _bucket_name(run), "mountOptions": "implicit-dirs"}}
        assert {"name": "gcs", "mountPath": "/data"} in pod["extraVolumeMounts"]
    ref = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text())
    assert _unknown_paths(values, ref) == []


def test_mpijob_pods_mount_the_bucket(run: RunResult) -> None:
    job = run.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs
    doc = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": job["metadata"], "spec": job["spec"]}
    for role in ("Launcher", "Worker"):
        template = job["spec"]["mpiReplicaSpecs"][role]["template"]
        assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
        assert template["spec"]["serviceAccountName"] == "deepspeed-data"
        (container,) = template["spec"]["containers"]
        assert {"name": "gcs", "mountPath": "/gcs"} in container["volumeMounts"]
    assert crd_problems(doc) == []
    assert pod_problems(doc) == []


def test_vertex_customjob_output(run: RunResult) -> None:
    spec = run.outputs["vertexCustomJob"]
    jsonschema.validate(spec, SCHEMA)
    primary, workers = spec["workerPoolSpecs"]
    assert (primary["replicaCount"], workers["replicaCount"]) == (1, 2)
    assert primary["containerSpec"]["imageUri"] == run.outputs["imageRef"]
    assert "@sha256:" in primary["containerSpec"]["imageUri"]
    assert primary["containerSpec"]["args"] == ["train.py", "--epochs", "1"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": f"gs://{_bucket_name(run)}/vertex"}
    assert spec["serviceAccount"] == "ds-vertex-dev@my-gcp-project.iam.gserviceaccount.com"
    assert spec["tensorboard"].startswith("projects/my-gcp-project/locations/us-west1/tensorboards/")


def test_vertex_identity(run: RunResult) -> None:
    vertex_sa = "serviceAccount:ds-vertex-dev@my-gcp-project.iam.gserviceaccount.com"
    roles = sorted(r.inputs["role"] for r in run.by_type("gcp:projects/iAMMember:IAMMember")
                   if r.inputs["member"] == vertex_sa)
    assert roles == ["roles/aiplatform.user", "roles/logging.logWriter"]
    readers = {r.inputs["member"] for r in run.by_type(
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")}
    assert vertex_sa in readers
    tb = run.one("gcp:vertex/aiTensorboard:AiTensorboard").inputs
    assert tb["region"] == "us-west1"


def test_the_bucket_does_not_wait_for_the_cluster_but_identity_bindings_do(run: RunResult) -> None:
    cluster = run.one("gcp:container/cluster:Cluster").urn
    assert cluster not in waits_for(run, run.one(BUCKET))
    # PROJECT.svc.id.goog exists only once a Workload Identity cluster does.
    for binding in run.by_type("gcp:serviceaccount/iAMMember:IAMMember"):
        assert cluster in binding.dependencies


def test_service_account_ids_carry_the_stack_name() -> None:
    from components.node_identity import account_id

    assert account_id("ds-data", "dev") == "ds-data-dev"
    assert account_id("ds-vertex", "Team_A.prod") == "ds-vertex-team-a-prod"
    long = account_id("ds-vertex", "x" * 40)
    assert len(long) == 30 and long.startswith("ds-vertex-")


def test_vertex_only_stack_has_no_cluster_but_an_image() -> None:
    cfg = {k: v for k, v in stack_yaml("dev").items() if k.startswith("gcp:")}
    cfg["deepspeed-stack:storage"] = {"enabled": True}
    cfg["deepspeed-stack:vertex"] = {"enabled": True, "workers": 0}
    from preview.engine import engine_config_from_yaml, run_program

    run = run_program(engine_config_from_yaml(cfg)[0], stack="vertex-only")
    assert run.by_type("gcp:container/cluster:Cluster") == []
    assert run.by_type("gcp:serviceaccount/iAMMember:IAMMember") == []  # no Workload Identity without GKE
    assert len(run.by_type("docker-build:index:Image")) == 1
    readers = [r.inputs["member"] for r in run.by_type(
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")]
    assert readers == ["serviceAccount:ds-vertex-vertex-only@my-gcp-project.iam.gserviceaccount.com"]
    assert len(run.outputs["vertexCustomJob"]["workerPoolSpecs"]) == 1


def test_preview_writes_the_customjob_spec(run: RunResult) -> None:
    from preview.sections import render_files, render_sections, vertex

    files = render_files(run, [vertex.files])
    spec = yaml.safe_load(files["vertex-customjob.yaml"])
    assert spec == run.outputs["vertexCustomJob"]
    jsonschema.validate(spec, SCHEMA)
    (title, body), = render_sections(run, [vertex.section])
    assert title == "Vertex AI CustomJob"
    assert "| workerpool1 | 2 | n1-standard-8 | 1 x NVIDIA_TESLA_T4 |" in body


def test_the_customjob_command_names_the_stacks_display_name() -> None:
    """vertex.displayName (the run's folders in the bucket are named so), not a fixed name."""
    from preview.sections import render_files, vertex

    displayed = stack_yaml("vertex")["deepspeed-stack:vertex"]["displayName"]
    files = render_files(stack_run("vertex"), [vertex.files])
    assert files["vertex-customjob.yaml"].splitlines()[1] == (
        f"# gcloud ai custom-jobs create --region=REGION --display-name={displayed} --config=vertex-customjob.yaml")


def test_a_changed_script_or_ds_config_changes_the_pods() -> None:
    # The pods mount their ConfigMaps by name; the content digest in the pod annotations makes a change
    # roll the Helm pods and start a new MPIJob run.
    def annotations(run: RunResult) -> tuple[str, str]:
        helm = run.one("kubernetes:helm.sh/v3:Release").inputs["values"]["worker"]["podAnnotations"]
        job = run.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs["spec"]["mpiReplicaSpecs"]["Worker"]
        key = "deepspeed-stack/config-sha256"
        return helm[key], job["template"]["metadata"]["annotations"][key]

    before = annotations(_run())
    changes = _with_data_path()
    for w in changes["deepspeed-stack:workloads"].values():
        w["deepspeed"] = {**w.get("deepspeed", {}), "stepsPerPrint": 99}
    after = annotations(run_stack("dev", changes))
    assert before[0] != after[0] and before[1] != after[1]


# --- an existing bucket (storage.existingBucket) ------------------------------------------------------------------

EXISTING = "team-training-data"


@functools.cache
def _existing_run() -> RunResult:
    config = _with_data_path()
    config["deepspeed-stack:storage"] = {"enabled": True, "existingBucket": EXISTING}
    return run_stack("dev", config)


def test_an_existing_bucket_is_granted_on_and_nothing_else() -> None:
    run = _existing_run()
    assert run.by_type(BUCKET) == []  # never created, so never changed, protected or deleted by the stack
    storage_types = {r.type for r in run.resources if r.type.startswith("gcp:storage/")}
    # Additive members only (no policy), and the stack's own objects for Vertex AI runs under its own folder.
    assert storage_types == {"gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:storage/bucketObject:BucketObject"}
    objects = [(r.inputs["bucket"], r.inputs["name"]) for r in run.by_type("gcp:storage/bucketObject:BucketObject")]
    assert objects == [(EXISTING, "deepspeed-stack/scripts/stop_ranks.py")]
    grants = [r.inputs for r in run.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")]
    assert {(g["bucket"], g["role"], g["member"]) for g in grants} == {
        (EXISTING, "roles/storage.objectUser", "serviceAccount:ds-data-dev@my-gcp-project.iam.gserviceaccount.com"),
        (EXISTING, "roles/storage.objectUser", "serviceAccount:ds-vertex-dev@my-gcp-project.iam.gserviceaccount.com")}
    assert [r for r in run.by_type("gcp:projects/iAMMember:IAMMember") if "storage" in r.inputs["role"]] == []
    assert run.outputs["bucket"] == EXISTING


def test_pods_and_vertex_use_the_existing_bucket() -> None:
    run = _existing_run()
    job = run.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs
    volumes = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    (gcs,) = [v for v in volumes if v["name"] == "gcs"]
    assert gcs["csi"]["volumeAttributes"]["bucketName"] == EXISTING
    assert EXISTING in json.dumps(run.outputs["vertexCustomJob"])


def test_an_existing_bucket_gets_a_warning_that_it_has_no_retention_rule() -> None:
    """The stack never changes a bucket it did not create, so its checkpoints/ rule (30 days, the schema's default)
    and 7-day soft delete are not there: a labelled warning in the preview and the PR summary says so and how to set
    them (gcloud storage buckets update's --lifecycle-file and --soft-delete-duration; the rule in Cloud Storage's
    lifecycle JSON)."""
    from preview import summary

    expected = (
        f"storage.existingBucket: the stack applies no retention or lifecycle setting to '{EXISTING}', a bucket it "
        "did not create: no rule deletes objects under checkpoints/ (its own bucket deletes them after "
        "storage.checkpointRetentionDays, 30 days), and soft delete and versioning stay as the bucket has them (its "
        "own: 7 days, off). To set the same yourself: `echo '{\"rule\":[{\"action\":{\"type\":\"Delete\"},"
        "\"condition\":{\"age\":30,\"matchesPrefix\":[\"checkpoints/\"]}}]}' > lifecycle.json && gcloud storage "
        f"buckets update gs://{EXISTING} --lifecycle-file=lifecycle.json --soft-delete-duration=7d` (--lifecycle-file "
        f"replaces the bucket's rules: add those it has, from `gcloud storage buckets describe gs://{EXISTING} "
        "--format='default(lifecycle_config)'`)")
    run = _existing_run()
    assert expected in run.warnings
    assert f"- :warning: {expected}" in summary.markdown(run, [], 0)
    own = stack_run("finetune")  # the stack's own bucket, with its rules
    assert own.outputs["bucket"] and not [w for w in own.warnings if w.startswith("storage.existingBucket")]


def test_settings_of_the_stacks_own_bucket_are_refused_with_an_existing_one() -> None:
    from conftest import config_problems

    config = stack_yaml("dev")
    config["deepspeed-stack:storage"] = {"enabled": True, "existingBucket": EXISTING, "location": "EU",
                                         "versioning": True, "checkpointRetentionDays": 14}
    found = config_problems(config)
    assert [p.split(":")[0] for p in found] == ["storage.location", "storage.versioning",
                                                "storage.checkpointRetentionDays"]
    assert found[0] == ("storage.location: a setting of a bucket the stack creates, but storage.existingBucket names "
                        f"'{EXISTING}', whose settings the stack never changes; remove location (or set it on the "
                        "bucket yourself)")
    # The defaults stand for unset: the bare key is fine.
    config["deepspeed-stack:storage"] = {"enabled": True, "existingBucket": EXISTING, "softDeleteDays": 7}
    assert config_problems(config) == []
    config["deepspeed-stack:storage"] = {"enabled": True, "existingBucket": "Team_Data"}
    assert config_problems(config) == [
        "storage.existingBucket: 'Team_Data' is not a valid bucket name: only lowercase letters, digits, - _ and ., "
        "starting and ending with a letter or digit, each dot-separated part at most 63 characters (Cloud Storage's "
        "naming rules)"]
