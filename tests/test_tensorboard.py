"""kind `tensorboard` (issue 29 item 2): a TensorBoard server of the event files finetune workloads write to the
bucket, as Pulumi.finetune.yaml deploys it (`board`, showing `tune`), its rules with a failing input each, and the
facts it rests on (data/tensorboard.yaml against TensorBoard's own source where make e2e's venv has it)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from conftest import DELETE, changed, config_model, problems, stack_run, stack_yaml

from checks import warnings
from preview import manifests
from preview.engine import RunResult

K8S_VERSION = "1.33.0"
COMPONENT = "deepspeed-stack:workloads:TensorBoardServer"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
B = "workloads.board"
# make e2e's venv holds TensorBoard 2.21.0, the version data/versions.yaml pins in the stack's image.
E2E_TENSORBOARD = Path("/opt/ds-e2e-venv/lib/python3.11/site-packages/tensorboard/plugins/core/core_plugin.py")


@pytest.fixture(scope="module")
def run() -> RunResult:
    return stack_run("finetune")


def objects(run: RunResult) -> dict[str, dict[str, Any]]:
    component = run.one(COMPONENT).urn
    docs = [manifests.manifest(r) for r in run.resources if r.parent == component and manifests.is_object(r)]
    return {doc["kind"]: doc for doc in docs}


def pod(run: RunResult) -> dict[str, Any]:
    return objects(run)["Deployment"]["spec"]["template"]


def container(run: RunResult) -> dict[str, Any]:
    (c,) = pod(run)["spec"]["containers"]
    return c


# --- the Kubernetes objects -----------------------------------------------------------------------------------

def test_every_object_is_a_valid_kubernetes_object(run: RunResult) -> None:
    docs = objects(run)
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert set(docs) == {"Namespace", "ServiceAccount", "Deployment", "Service", "NetworkPolicy"}
    assert {doc["metadata"].get("namespace", doc["metadata"]["name"]) for doc in docs.values()} == {"tensorboard"}


def test_the_server_reads_the_folder_the_run_writes(run: RunResult) -> None:
    """--logdir_spec names tune's run by its workload name, at the folder tune's ranks are told to write their event
    files to (TENSORBOARD_LOGGING_DIR of the MPIJob), as both pods see the bucket (at /gcs)."""
    job = next(r.inputs for r in run.by_type(MPIJOB) if r.inputs["metadata"]["name"] == "tune")
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    written = {e["name"]: e.get("value") for e in launcher["env"]}["TENSORBOARD_LOGGING_DIR"]
    c = container(run)
    assert c["command"] == ["tensorboard"]
    assert c["args"] == ["--logdir_spec", f"tune:{written}", "--host", "0.0.0.0", "--port", "6006",
                         "--reload_interval", "30"]
    assert written == "/gcs/logs/tune"
    assert c["ports"] == [{"name": "http", "containerPort": 6006, "protocol": "TCP"}]


def test_the_bucket_is_mounted_read_only_as_the_bucket_readers_account(run: RunResult) -> None:
    p, c = pod(run), container(run)
    (gcs,) = [v for v in p["spec"]["volumes"] if "csi" in v]
    assert gcs["csi"]["driver"] == "gcsfuse.csi.storage.gke.io" and gcs["csi"]["readOnly"] is True
    assert {"name": gcs["name"], "mountPath": "/gcs", "readOnly": True} in c["volumeMounts"]
    assert p["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    # storage.kubernetesServiceAccount (schema default deepspeed-data), mapped to the bucket's Google account in the
    # server's namespace like every other reader's.
    assert p["spec"]["serviceAccountName"] == "deepspeed-data"
    ksa = objects(run)["ServiceAccount"]
    assert ksa["metadata"]["name"] == "deepspeed-data"
    assert "iam.gke.io/gcp-service-account" in ksa["metadata"]["annotations"]
    members = {r.inputs.get("member") for r in run.by_type("gcp:serviceaccount/iAMMember:IAMMember")}
    assert "serviceAccount:my-gcp-project.svc.id.goog[tensorboard/deepspeed-data]" in members


def test_one_hardened_pod_on_the_system_pool(run: RunResult) -> None:
    deployment, p, c = objects(run)["Deployment"], pod(run), container(run)
    assert deployment["spec"]["replicas"] == 1
    spec = p["spec"]
    assert spec["nodeSelector"] == {"deepspeed-stack/pool": "system"} and "tolerations" not in spec
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "500m", "memory": "2Gi"}}
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert (sc["allowPrivilegeEscalation"], sc["privileged"], sc["readOnlyRootFilesystem"], sc["capabilities"]) == \
        (False, False, True, {"drop": ["ALL"]})
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # the only writable place
    assert {probe: c[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")} == \
        dict.fromkeys(("startupProbe", "readinessProbe", "livenessProbe"), "/data/environment")
    # The stack's image by digest, and the one waiver its other pods carry (its user is 1001).
    assert re.fullmatch(r"us-central1-docker\.pkg\.dev/my-gcp-project/deepspeed/deepspeed@sha256:[0-9a-f]{64}",
                        c["image"])
    skips = [v for k, v in deployment["metadata"]["annotations"].items() if k.startswith("checkov.io/skip")]
    assert [s.split("=", 1)[0] for s in skips] == ["CKV_K8S_40"]
    assert deployment["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"


def test_reachable_by_port_forward_only(run: RunResult) -> None:
    docs = objects(run)
    service, policy = docs["Service"]["spec"], docs["NetworkPolicy"]["spec"]
    assert service["type"] == "ClusterIP"
    assert service["ports"] == [{"name": "http", "port": 6006, "targetPort": "http", "protocol": "TCP"}]
    selected = policy["podSelector"]["matchLabels"]
    assert selected.items() <= pod(run)["metadata"]["labels"].items() and service["selector"] == selected
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    assert policy["egress"] == [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53},
                                           {"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 80},
                                           {"protocol": "TCP", "port": 988}]}]


def test_the_summary_says_how_to_open_it(run: RunResult) -> None:
    assert run.outputs["workloads"]["board"] == {
        "kind": "tensorboard", "deployment": "board", "namespace": "tensorboard", "workloads": ["tune"],
        "logDirs": {"tune": "/gcs/logs/tune"},
        "portForward": "kubectl port-forward svc/board 6006:6006 -n tensorboard", "url": "http://localhost:6006"}


def test_by_default_every_finetune_workload_on_the_bucket() -> None:
    from workloads import tensorboard

    m = model_without_names = config_model(changed("finetune", {f"{B}.tensorboard.workloads": DELETE}))
    w = model_without_names.workloads["board"]
    assert [t.name for t in tensorboard.shown(m, w)] == ["tune"]
    assert tensorboard.args(m, w)[:2] == ["--logdir_spec", "tune:/gcs/logs/tune"]


# --- the rules: one failing input each ------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "expected"), [
    ({f"{B}.tensorboard.workloads": ["tun"]},
     f"{B}.tensorboard.workloads[0]: no workload is named 'tun'; did you mean `tune`? (the stack's finetune "
     "workloads: tune)"),
    ({f"{B}.tensorboard.workloads": ["tune", "chat"]},
     f"{B}.tensorboard.workloads[1]: chat is a serve workload; only finetune workloads write TensorBoard event files "
     "(finetune.py, to logs/<workload>/ of the bucket) (the stack's finetune workloads: tune)"),
    ({"workloads.tune.gcsFuse.enabled": False},
     f"{B}.tensorboard.workloads[0]: tune writes its event files to its claim (/data/logs/tune), not to the bucket "
     "this server reads; set workloads.tune.gcsFuse.enabled: true"),
    ({f"{B}.tensorboard.port": 80}, f"{B}.tensorboard.port: must be at least 1024, got 80"),
    ({f"{B}.tensorboard.port": 70000}, f"{B}.tensorboard.port: must be at most 65535, got 70000"),
    ({"storage.enabled": False}, f"{B}.gcsFuse.enabled: needs the stack's bucket; set storage.enabled: true"),
    ({f"{B}.gcsFuse.enabled": False},
     f"{B}.gcsFuse.enabled: false, but a TensorBoard server reads the runs' event files from the stack's bucket "
     "through its GCS FUSE mount; remove the key (it is always true for kind tensorboard)"),
    ({f"{B}.gcsFuse.mountPath": "/gcs:data"},
     f"{B}.gcsFuse.mountPath: '/gcs:data' holds ':', which TensorBoard's --logdir_spec reads as separators "
     "(NAME:PATH,NAME:PATH); choose a path without them, e.g. /gcs"),
    # e2-standard-4: 4 vCPUs, 16 GiB; allocatable 3.92 CPUs (GKE's CPU reserve of 80m) and 12.95 GiB; the sidecar
    # asks 100m and 128Mi (workloads/gcs_fuse.py).
    ({f"{B}.tensorboard.cpu": "4"},
     f"{B}.tensorboard.cpu: 4 is more than a e2-standard-4 node of the system pool (cluster.systemPool.machineType) "
     "has for it: 3.92 allocatable less the GCS FUSE sidecar's 0.1 = 3.82; ask less (the default is 500m)"),
    ({f"{B}.tensorboard.memory": "13Gi"},
     f"{B}.tensorboard.memory: 13Gi is more than a e2-standard-4 node of the system pool "
     "(cluster.systemPool.machineType) has for it: 12.95 GiB allocatable less the GCS FUSE sidecar's 0.125 GiB = "
     "12.82 GiB; ask less (the default is 2Gi), or a larger system pool machine"),
    ({f"{B}.pool": "l4"},
     f"{B}.pool: not a key of kind tensorboard (its keys: gcsFuse, image, kind, namespace, tensorboard); it is a key "
     "of kind helm, mpijob, finetune, serve"),
    ({f"{B}.namespace": "finetune"},
     f"{B}.namespace: 'finetune' is also the namespace of tune; each workload creates and deletes its own namespace, "
     "so give it one of its own"),
])
def test_each_rule_refuses_its_failing_input(changes: dict[str, Any], expected: str) -> None:
    assert expected in problems("finetune", changes)


def test_nothing_to_show_is_refused() -> None:
    found = problems("finetune", {"workloads.tune": DELETE, "workloads.chat": DELETE,
                                  f"{B}.tensorboard.workloads": DELETE})
    assert found == [f"{B}.tensorboard.workloads: empty, which shows every finetune workload that writes its event "
                     "files to the bucket, but the stack has no finetune workload; add a finetune workload with "
                     "gcsFuse.enabled: true, or remove board"]


def test_a_run_on_its_claim_is_left_out_with_a_warning() -> None:
    config = changed("finetune", {f"{B}.tensorboard.workloads": DELETE, "nodePools[0].maxNodes": 3})
    other = copy.deepcopy(config["deepspeed-stack:workloads"]["tune"])
    other.update(namespace="finetune-claim", gcsFuse={"enabled": False}, workers=1)
    other["finetune"] = {**other["finetune"], "datasetPath": None, "dataset": "tatsu-lab/alpaca",
                         "promptField": None, "responseField": None}
    other["finetune"] = {k: v for k, v in other["finetune"].items() if v is not None}
    other["storage"] = {**other["storage"], "claimName": "claim-tune"}
    config["deepspeed-stack:workloads"]["claimrun"] = other
    m = config_model(config)
    assert f"{B}.tensorboard.workloads: claimrun is not shown: it writes its event files to its claim, not the " \
           "bucket (set workloads.claimrun.gcsFuse.enabled: true to show it)" in warnings(m)


# --- the facts ------------------------------------------------------------------------------------------------

def test_the_facts_are_tensorboards_own() -> None:
    """data/tensorboard.yaml's port (the schema's default) and flags are TensorBoard 2.21.0's, read in its source
    where make e2e's venv has it; the version is the image's (data/versions.yaml)."""
    from model.config_schema import kind_branches, schema
    from workloads.tensorboard import facts

    server = facts()["server"]
    branch = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])["tensorboard"]
    assert branch["properties"]["tensorboard"]["properties"]["port"]["default"] == server["defaultPort"] == 6006
    versions = (Path(__file__).resolve().parent.parent / "data" / "versions.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s+tensorboard: 2\.21\.0\b", versions, re.M)
    if not E2E_TENSORBOARD.is_file():
        pytest.skip("make e2e's venv (TensorBoard's source) is not on this machine")
    source = E2E_TENSORBOARD.read_text(encoding="utf-8")
    assert "DEFAULT_PORT = 6006" in source
    for flag in ("--logdir_spec", "--host", "--port", "--reload_interval"):
        assert f'"{flag}"' in source
    assert f'"{server["healthPath"]}": self._serve_environment' in source


def test_the_example_shows_tune() -> None:
    board = stack_yaml("finetune")["deepspeed-stack:workloads"]["board"]
    assert (board["kind"], board["tensorboard"]["workloads"]) == ("tensorboard", ["tune"])
