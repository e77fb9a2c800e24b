"""The MPIJob renderer and its rules: CRD schema, the operator's own admission rules, launcher and
worker commands, the config checks of mpijob workloads, and an MPIJob on an NVIDIA GKE pool."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml
from conftest import DELETE, PROJECT_DIR, model, problems, reference, run_stack, stack_yaml

from checks import ConfigError, load
from model.types import StackConfig
from preview.engine import RunResult, engine_config_from_yaml
from workloads import mpijob
from workloads.placement import placement

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
K8S_VERSION = "1.33.0"
GAUDI_JOB = "gaudi-llm-ds-ft"
# An NVIDIA MPIJob on the dev stack's T4 pool (T4 has no bf16, hence fp16).
# The stack's Gaudi image as ContainerImage would hand it over: pinned by digest.
GAUDI_IMAGE = "registry.example.internal/ml/deepspeed-gaudi@sha256:" + "c" * 64
NVIDIA_WORKLOAD = {"kind": "mpijob", "pool": "t4", "workers": 2, "deepspeed": {"precision": "fp16"},
                   "storage": {"storageClass": "standard-rwx"}}


# --- helpers --------------------------------------------------------------------------------------





def render(m: StackConfig, name: str, image: str | None = None, secret: str | None = None) -> dict[str, Any]:
    w = m.workloads[name]
    inputs = mpijob.MpiJobInputs(workload=w, placement=placement(m, w),
                                 image=mpijob.launcher_image(w, image, GAUDI_IMAGE),
                                 config_map=mpijob.config_map_name(name), hf_token_secret=secret)
    return mpijob.render(inputs, w.namespace)


@functools.cache
def crd_schema(version: str = "v0.8.0") -> dict[str, Any]:
    with open(reference("mpi-operator", f"kubeflow.org_mpijobs.{version}.yaml"), encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 9,000 lines: libyaml if there
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    return served["schema"]["openAPIV3Schema"]


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Fields the API server would prune: a structural schema drops keys it does not declare."""
    found: list[str] = []
    if isinstance(value, dict) and schema.get("type") == "object":
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, sub in value.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_fields(props[key], sub, where)
            elif isinstance(extra, dict):
                found += unknown_fields(extra, sub, where)
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{i}]")
    return found


def crd_problems(job: dict[str, Any]) -> list[str]:
    schema = crd_schema()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(job)]
    return errors + [f"{f}: not in the CRD (pruned)" for f in unknown_fields(schema, job)]


def pod_problems(job: dict[str, Any]) -> list[str]:
    """Each replica's pod template, validated strictly as a core/v1 Pod."""
    out = []
    for role, rs in job["spec"]["mpiReplicaSpecs"].items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"x-{role.lower()}"},
               "spec": rs["template"]["spec"]}
        try:
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            out.append(f"{role}: {err.message}")
    return out


def container(job: dict[str, Any], role: str) -> dict[str, Any]:
    (c,) = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"]
    return c


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


@pytest.fixture(scope="module")
def gaudi_model() -> StackConfig:
    return model("gaudi")


@pytest.fixture(scope="module")
def gaudi_job(gaudi_model: StackConfig) -> dict[str, Any]:
    return render(gaudi_model, GAUDI_JOB, secret="gaudi-llm-ds-ft-hf-token")


@pytest.fixture(scope="module")
def nvidia_model() -> StackConfig:
    return model("dev", {"workloads": {"ds-t4": copy.deepcopy(NVIDIA_WORKLOAD)}, "mpiOperator.install": True})


# --- CRD schema and operator rules ----------------------------------------------------------------

def test_gaudi_job_is_valid_for_the_v080_crd(gaudi_job: dict[str, Any]) -> None:
    assert crd_problems(gaudi_job) == []
    assert mpijob.operator_problems(gaudi_job) == []
    assert pod_problems(gaudi_job) == []


def test_nvidia_job_is_valid_for_the_v080_crd(nvidia_model: StackConfig) -> None:
    job = render(nvidia_model, "ds-t4", image="example.invalid/deepspeed@sha256:" + "0" * 64)
    assert crd_problems(job) == []
    assert mpijob.operator_problems(job) == []
    assert pod_problems(job) == []


def test_launcher_creation_policy_needs_operator_05_or_newer() -> None:
    """The field exists in v0.8.0's CRD; v0.4.0 (what Omnia 1.7 installs) would prune it."""
    assert "launcherCreationPolicy" in crd_schema("v0.8.0")["properties"]["spec"]["properties"]
    assert "launcherCreationPolicy" not in crd_schema("v0.4.0")["properties"]["spec"]["properties"]


def test_schema_check_catches_a_wrong_type_and_an_unknown_field(gaudi_job: dict[str, Any]) -> None:
    job = copy.deepcopy(gaudi_job)
    job["spec"]["slotsPerWorker"] = "8"
    job["spec"]["slotPerWorker"] = 8
    found = crd_problems(job)
    assert "spec.slotsPerWorker: '8' is not of type 'integer'" in found
    assert "spec.slotPerWorker: not in the CRD (pruned)" in found


@pytest.mark.parametrize(("path", "value", "message"), [
    (("Launcher", "replicas"), 2, "spec.mpiReplicaSpecs.Launcher.replicas: must be 1, got 2"),
    (("Worker", "replicas"), 0, "spec.mpiReplicaSpecs.Worker.replicas: must be at least 1, got 0"),
    (("Worker", "restartPolicy"), "Always", "spec.mpiReplicaSpecs.Worker.restartPolicy: must be Never or OnFailure"),
    (("Launcher", "template", "spec", "containers"), [],
     "spec.mpiReplicaSpecs.Launcher.template.spec.containers: at least one container"),
])
def test_operator_rules_fail(gaudi_job: dict[str, Any], path: tuple, value: Any, message: str) -> None:
    job = copy.deepcopy(gaudi_job)
    node = job["spec"]["mpiReplicaSpecs"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(p.startswith(message) for p in mpijob.operator_problems(job)), mpijob.operator_problems(job)


def test_operator_rules_clean_pod_policy_and_worker_host_name(gaudi_job: dict[str, Any]) -> None:
    job = copy.deepcopy(gaudi_job)
    job["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    job["metadata"]["name"] = "9-lives"
    found = mpijob.operator_problems(job)
    assert "spec.runPolicy.cleanPodPolicy: must be None, Running or All, got Sometimes" in found
    assert found[-1].startswith("metadata.name: '9-lives-worker-0' (the last worker) is not a DNS-1035 label")


# --- the Gaudi launcher and workers ---------------------------------------------------------------

def test_gaudi_job_shape(gaudi_job: dict[str, Any]) -> None:
    spec = gaudi_job["spec"]
    assert (gaudi_job["apiVersion"], gaudi_job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert spec["slotsPerWorker"] == 8
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 6}  # restarts resume (recovery)
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert (launcher["replicas"], launcher["restartPolicy"]) == (1, "OnFailure")
    assert (worker["replicas"], worker["restartPolicy"]) == (1, "Never")
    assert worker["template"]["spec"]["hostIPC"] is True
    assert "hostIPC" not in launcher["template"]["spec"]
    limits = container(gaudi_job, "Worker")["resources"]
    assert limits["limits"] == limits["requests"]
    assert (limits["limits"]["habana.ai/gaudi"], limits["limits"]["cpu"]) == ("8", "64")
    assert set(limits["limits"]) == {"habana.ai/gaudi", "hugepages-2Mi", "memory", "cpu"}


def test_host_ipc_only_when_asked() -> None:
    m = model("gaudi", {f"workloads.{GAUDI_JOB}.hostIPC": False})
    assert "hostIPC" not in render(m, GAUDI_JOB)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def test_gaudi_launcher_runs_gaudi_spawn_over_the_operator_hostfile(gaudi_job: dict[str, Any]) -> None:
    script = container(gaudi_job, "Launcher")["args"][0]
    assert container(gaudi_job, "Launcher")["command"] == ["/bin/bash", "-c"]
    assert 'HOSTSFILE="$OMPI_MCA_orte_default_hostfile"' in script
    assert 'export MASTER_ADDR="$(head -n 1 "$HOSTSFILE"' in script
    assert 'export no_proxy="${no_proxy:+$no_proxy,}$KUBERNETES_SERVICE_HOST"' in script
    # The stack's image has optimum-habana and DeepSpeed: nothing is installed, no mpirun, no /etc/ssh edits.
    assert script.splitlines()[-2] == "cd /opt/optimum-habana/examples/language-modeling"
    for installing in ("git clone", "pip install", "mpirun", "/etc/ssh/ssh_config"):
        assert installing not in script
    train = script.splitlines()[-1]
    # run_ranks: the launcher's function that remembers a final status and passes a stop on (test_gaudi_launcher.py).
    assert train.startswith('run_ranks python ../gaudi_spawn.py --hostfile="$HOSTSFILE" --use_deepspeed --world_size 8 '
                            'run_lora_clm.py --model_name_or_path "$LLM_MODEL" --dataset_name tatsu-lab/alpaca '
                            '--num_train_epochs "$NUM_EPOCHS" --deepspeed /etc/deepspeed/ds_config.json ')
    # Trainer arguments that must agree with ds_config.json come from the deepspeed block (8 x 2, bf16).
    assert "--per_device_train_batch_size 8 --gradient_accumulation_steps 2 --max_grad_norm 0.3 --bf16 True " \
           "--learning_rate 0.0003 --lora_rank 8 --lora_alpha 16 --lora_dropout 0.05 --lora_target_modules q_proj " \
           "v_proj " in train
    assert "--use_habana --use_lazy_mode" in train
    assert train.endswith("--do_eval --dataset_concatenation --max_seq_length 512 "
                          "--ddp_bucket_cap_mb 50 --adam_epsilon 1e-08 --validation_split_percentage 4 "
                          "--low_cpu_mem_usage True")
    # Nothing is patched into the training script (the original sed-injected the token and proxies).
    assert "run_lora_clm.py" not in script.replace(train, "")


def test_gaudi_launcher_env_and_token_from_the_secret(gaudi_job: dict[str, Any]) -> None:
    launcher, worker = env(container(gaudi_job, "Launcher")), env(container(gaudi_job, "Worker"))
    # The token is a mounted file (never an env var in the pod spec); the script exports it for ssh to send on.
    assert "HF_TOKEN" not in launcher and "HUGGING_FACE_HUB_TOKEN" not in launcher
    spec = gaudi_job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert {v["name"]: v for v in spec["volumes"]}["hf-token"]["secret"] == {
        "secretName": "gaudi-llm-ds-ft-hf-token", "defaultMode": 0o440}
    assert {"name": "hf-token", "mountPath": "/var/run/secrets/huggingface", "readOnly": True} in \
        container(gaudi_job, "Launcher")["volumeMounts"]
    assert container(gaudi_job, "Launcher")["args"][0].splitlines()[:2] == [
        'HF_TOKEN="$(cat /var/run/secrets/huggingface/token)"; export HF_TOKEN',
        'HUGGING_FACE_HUB_TOKEN="$(cat /var/run/secrets/huggingface/token)"; export HUGGING_FACE_HUB_TOKEN']
    # HF_HOME: in the folder the ranks (uid 10001) make and own, clear of Omnia's root-made /storage/huggingface.
    assert (launcher["HF_HOME"], launcher["LLM_MODEL"], launcher["NUM_HPU"], launcher["NUM_EPOCHS"]) == (
        "/storage/deepspeed-stack/huggingface", "Qwen/Qwen2.5-7B-Instruct", "8", "3")
    assert launcher["no_proxy"] == "127.0.0.1,localhost"
    assert "http_proxy" not in launcher  # empty in config: not set at all
    # Workers get the token only through ssh from the launcher, never in their own pod spec.
    assert "HF_TOKEN" not in worker and "HUGGING_FACE_HUB_TOKEN" not in worker
    assert worker["HF_HOME"] == "/storage/deepspeed-stack/huggingface"


def test_training_processes_get_the_token_through_ssh(gaudi_model: StackConfig, gaudi_job: dict[str, Any]) -> None:
    w = gaudi_model.workloads[GAUDI_JOB]
    client = mpijob.config_map_data(w, placement(gaudi_model, w), has_token=True)["ssh_client.conf"].splitlines()
    assert "SendEnv HF_HOME no_proxy NO_PROXY HF_TOKEN HUGGING_FACE_HUB_TOKEN" in client
    assert "Port 2222" in client
    assert "KexAlgorithms curve25519-sha256,sntrup761x25519-sha512@openssh.com" in client  # as Omnia pins it
    mounts = {m["name"]: m["mountPath"] for m in container(gaudi_job, "Launcher")["volumeMounts"]}
    assert mounts["ssh-client-config"] == "/etc/ssh/ssh_config.d"
    worker = container(gaudi_job, "Worker")["args"][0]
    assert worker.splitlines()[-1] == (
        "exec /usr/sbin/sshd -D -e -f /etc/ssh/sshd_deepspeed_config -h /tmp/ssh_host_ed25519_key -o StrictModes=no "
        "-o 'AcceptEnv=HF_HOME no_proxy NO_PROXY HF_TOKEN HUGGING_FACE_HUB_TOKEN'")


def test_install_at_start_is_omnias_path_only_as_an_opt_in() -> None:
    job = render(model("gaudi", {f"workloads.{GAUDI_JOB}.gaudi.installAtStart": True}), GAUDI_JOB,
                 secret="gaudi-llm-ds-ft-hf-token")
    script = container(job, "Launcher")["args"][0]
    assert "git clone --depth 1 --branch v1.15.0 https://github.com/huggingface/optimum-habana" in script
    assert "pip install git+https://github.com/HabanaAI/DeepSpeed.git@1.19.0" in script
    assert 'mpirun --npernode 1 --tag-output --allow-run-as-root --prefix "$MPI_ROOT" -x HF_HOME' in script
    assert "'SendEnv HF_HOME no_proxy NO_PROXY HF_TOKEN HUGGING_FACE_HUB_TOKEN'" in script
    assert container(job, "Worker")["args"][0].splitlines() == [
        "/usr/bin/ssh-keygen -A",
        "/usr/sbin/sshd -o 'AcceptEnv=HF_HOME no_proxy NO_PROXY HF_TOKEN HUGGING_FACE_HUB_TOKEN'",
        "exec sleep infinity",
    ]
    # Habana's stock image at the pinned version tag (data/gaudi_software.yaml), not `:latest`.
    assert container(job, "Worker")["image"] == (
        "vault.habana.ai/gaudi-docker/1.19.1/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:1.19.1-26")
    assert "sshAuthMountPath" not in job["spec"]


def test_no_token_no_token_variables(gaudi_model: StackConfig) -> None:
    job = render(gaudi_model, GAUDI_JOB, secret=None)
    assert "HF_TOKEN" not in env(container(job, "Launcher"))
    assert "HF_TOKEN" not in container(job, "Launcher")["args"][0]


def test_proxy_variables_both_spellings_and_forwarded() -> None:
    m = model("gaudi", {f"workloads.{GAUDI_JOB}.proxy.https": "http://proxy.example:3128"})
    job = render(m, GAUDI_JOB)
    launcher = env(container(job, "Launcher"))
    assert launcher["https_proxy"] == launcher["HTTPS_PROXY"] == "http://proxy.example:3128"
    w = m.workloads[GAUDI_JOB]
    client = mpijob.config_map_data(w, placement(m, w), has_token=False)["ssh_client.conf"].splitlines()
    assert "SendEnv HF_HOME https_proxy HTTPS_PROXY no_proxy NO_PROXY" in client
    opt_in = model("gaudi", {f"workloads.{GAUDI_JOB}.proxy.https": "http://proxy.example:3128",
                             f"workloads.{GAUDI_JOB}.gaudi.installAtStart": True})
    assert "-x https_proxy -x HTTPS_PROXY" in container(render(opt_in, GAUDI_JOB), "Launcher")["args"][0]


def test_volumes_claim_config_and_shm(gaudi_job: dict[str, Any]) -> None:
    for role in ("Launcher", "Worker"):
        spec = gaudi_job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container(gaudi_job, role)["volumeMounts"]}
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "shared-model"
        assert mounts["shared"] == "/storage"
        assert volumes["deepspeed-config"]["configMap"]["name"] == "gaudi-llm-ds-ft-deepspeed"
        assert mounts["deepspeed-config"] == "/etc/deepspeed"
    worker = gaudi_job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {v["name"]: v for v in worker["volumes"]}["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_image_the_stacks_gaudi_image_or_the_override(gaudi_model: StackConfig) -> None:
    assert container(render(gaudi_model, GAUDI_JOB), "Worker")["image"] == GAUDI_IMAGE
    m = model("gaudi", {f"workloads.{GAUDI_JOB}.image": "registry.example/gaudi:1.0"})
    job = render(m, GAUDI_JOB)
    assert container(job, "Launcher")["image"] == container(job, "Worker")["image"] == "registry.example/gaudi:1.0"


def test_launch_command_replaces_the_generated_one() -> None:
    m = model("gaudi", {f"workloads.{GAUDI_JOB}.launch.command": "echo hello"})
    assert container(render(m, GAUDI_JOB), "Launcher")["args"] == ["echo hello"]


def test_ds_config_in_the_config_map(gaudi_model: StackConfig) -> None:
    w = gaudi_model.workloads[GAUDI_JOB]
    data = mpijob.config_map_data(w, placement(gaudi_model, w), has_token=False)
    # The workers' preStop hook is shipped with the job's files (workloads/recovery.py).
    assert set(data) == {"ds_config.json", "ssh_client.conf", "stop_ranks.py"}
    ds = json.loads(data["ds_config.json"])
    assert ds["train_batch_size"] == 1 * 8 * 8 * 2  # workers x cards x micro batch x accumulation
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2)
    assert ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 2


# --- NVIDIA on a GKE pool -------------------------------------------------------------------------

def test_nvidia_job_uses_the_pool_and_the_stack_image(nvidia_model: StackConfig) -> None:
    image = "us-west1-docker.pkg.dev/p/deepspeed/deepspeed@sha256:" + "a" * 64
    job = render(nvidia_model, "ds-t4", image=image)
    spec = job["spec"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert spec["slotsPerWorker"] == 1
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert worker["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
                                      "deepspeed-stack/pool": "t4"}
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert container(job, "Worker")["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container(job, "Launcher")["image"] == container(job, "Worker")["image"] == image
    assert spec["sshAuthMountPath"] == "/home/deepspeed/.ssh"
    assert worker["securityContext"]["runAsUser"] == 1001


def test_nvidia_launcher_runs_deepspeed_with_the_shipped_script(nvidia_model: StackConfig) -> None:
    job = render(nvidia_model, "ds-t4", image="img@sha256:" + "b" * 64)
    script = container(job, "Launcher")["args"][0]
    assert script.splitlines()[-1] == (
        'run_ranks deepspeed --force_multi --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" '
        "/etc/deepspeed/smoke_train.py --deepspeed_config /etc/deepspeed/ds_config.json")
    w = nvidia_model.workloads["ds-t4"]
    data = mpijob.config_map_data(w, placement(nvidia_model, w), has_token=False)
    assert data["smoke_train.py"] == (PROJECT_DIR / "recipes" / "smoke_train.py").read_text()
    modules = sorted(p.name for p in (PROJECT_DIR / "recipes").glob("smoke_train_*.py"))  # imported beside it
    assert modules and all(data[name] == (PROJECT_DIR / "recipes" / name).read_text() for name in modules)
    assert json.loads(data["ds_config.json"])["fp16"]["enabled"] is True
    assert "Port 2222" in data["ssh_client.conf"].splitlines()
    mounts = {m["name"]: m["mountPath"] for m in container(job, "Launcher")["volumeMounts"]}
    assert mounts["ssh-client-config"] == "/etc/ssh/ssh_config.d"


def test_a_kinds_own_launch_on_the_nvidia_path(nvidia_model: StackConfig) -> None:
    """The entry point a kind built on the NVIDIA MPIJob uses (workloads/mpijob/nvidia.py): its rank command,
    env, volumes and files, on the shared shape; the job stays valid for the CRD, the operator and a Pod."""
    w = nvidia_model.workloads["ds-t4"]
    where = placement(nvidia_model, w)
    out = {"name": "out", "emptyDir": {}}
    launch = mpijob.NvidiaLaunch(
        rank_command=["/etc/deepspeed/finetune.py", "--deepspeed", "/etc/deepspeed/ds_config.json", "--epochs", "1"],
        env={"CHECKPOINT_DIR": "/out/checkpoints/ds-t4", "MODEL_DIR": "/out/models/ds-t4"},
        volumes=[out], mounts=[{"name": "out", "mountPath": "/out"}], files={"finetune.py": "print('hi')\n"},
        hf_trainer=True)
    inputs = mpijob.MpiJobInputs(workload=w, placement=where, image="img@sha256:" + "b" * 64,
                                 config_map="ds-t4-deepspeed", hf_token_secret="ds-t4-hf-token")
    job = mpijob.render(inputs, w.namespace, launch=launch)
    assert crd_problems(job) == [] and mpijob.operator_problems(job) == [] and pod_problems(job) == []
    assert container(job, "Launcher")["args"][0].splitlines()[-1] == (
        'run_ranks deepspeed --force_multi --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" '
        "/etc/deepspeed/finetune.py --deepspeed /etc/deepspeed/ds_config.json --epochs 1")
    for role in ("Launcher", "Worker"):
        c = container(job, role)
        assert env(c)["CHECKPOINT_DIR"] == "/out/checkpoints/ds-t4" and env(c)["MODEL_DIR"] == "/out/models/ds-t4"
        assert {"name": "out", "mountPath": "/out"} in c["volumeMounts"]
        assert out in job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["volumes"]
    data = mpijob.config_map_data(w, where, has_token=True, launch=launch)
    assert data["finetune.py"] == "print('hi')\n" and "smoke_train.py" not in data
    # The ranks get the variables over ssh: the launcher's client sends them (the workers' sshd accepts them).
    assert ("SendEnv HF_HOME no_proxy NO_PROXY CHECKPOINT_DIR MODEL_DIR PATH LD_LIBRARY_PATH HF_TOKEN "
            "HUGGING_FACE_HUB_TOKEN") in data["ssh_client.conf"].splitlines()
    # ZeRO-3 under the Hugging Face Trainer: the Trainer sizes the prefetch bucket from the model ("auto").
    stage3 = msgspec.structs.replace(w, deepspeed=msgspec.structs.replace(w.deepspeed, zero_stage=3))
    zero = json.loads(mpijob.config_map_data(stage3, where, False, launch)["ds_config.json"])["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == "auto"


@pytest.fixture(scope="module")
def nvidia_run() -> RunResult:
    return run_stack("dev", {"workloads": {"ds-t4": copy.deepcopy(NVIDIA_WORKLOAD)}, "mpiOperator": {"install": True}})


def test_nvidia_mpijob_on_the_dev_pool_under_mocks(nvidia_run: RunResult) -> None:
    reg = nvidia_run.one(MPIJOB, "ds-t4-mpijob")
    assert crd_problems({k: reg.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")}) == []
    worker = reg.inputs["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert worker["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-tesla-t4"
    # The stack's image, pinned by digest, as the ContainerImage component exported it.
    assert worker["containers"][0]["image"] == nvidia_run.outputs["imageRef"]
    assert "@sha256:" in nvidia_run.outputs["imageRef"]
    # On the GKE cluster's provider.
    provider = nvidia_run.one("pulumi:providers:kubernetes")
    assert reg.provider == provider.urn


def test_nvidia_training_job_waits_only_for_its_pool_the_operator_and_the_image_grant(nvidia_run: RunResult) -> None:
    job = nvidia_run.one("deepspeed-stack:workloads:TrainingJob", "ds-t4")
    pool = nvidia_run.one("gcp:container/nodePool:NodePool", "t4")
    # It pulls the stack's image, so it also waits for the nodes' read grant on the repository (issue 9).
    reader = nvidia_run.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert job.dependencies == sorted([pool.urn, reader.urn])  # and nothing else
    # The MPIJob alone waits for the MPI operator's manifest (its CRD and controller) the stack installs: a new GKE
    # cluster has none (checks/cluster_wide.py); the namespace, claim and ConfigMap need not.
    manifest = nvidia_run.one("kubernetes:yaml/v2:ConfigFile", "mpi-operator-manifest")
    assert manifest.urn in nvidia_run.one(MPIJOB).dependencies


# --- config checks of mpijob workloads ------------------------------------------------------------

def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


def test_gaudi_stack_is_valid() -> None:
    assert problems("gaudi", {}) == []


def test_existing_cluster_needs_kubeconfig_or_context() -> None:
    assert only(problems("gaudi", {"kubernetes": DELETE})) == (
        "kubeconfig: the stack has no `cluster`, so its MPIJobs go to an existing cluster; set its credentials with "
        "`pulumi config set --secret kubeconfig \"$(cat ~/.kube/config)\"` and/or kubernetes.context")
    # The secret kubeconfig alone is enough.
    assert problems("gaudi", {"kubernetes": DELETE, "kubeconfig": {"secure": "v1:abc"}}) == []


def test_kubeconfig_and_context_are_errors_with_a_cluster() -> None:
    found = problems("dev", {"kubernetes.context": "other", "kubeconfig": {"secure": "v1:abc"}})
    assert "kubernetes.context: unused, the stack deploys to its own GKE cluster (`cluster` is set); remove " \
           "kubernetes.context, or remove `cluster` to deploy to an existing cluster" in found
    assert any(p.startswith("kubeconfig: unused, the stack deploys to its own GKE cluster") for p in found)


def test_gaudi_must_not_name_a_pool() -> None:
    assert only(problems("gaudi", {f"workloads.{GAUDI_JOB}.pool": "t4"})) == (
        f"workloads.{GAUDI_JOB}.pool: a Gaudi MPIJob runs on habana.ai/gaudi nodes of an existing cluster, "
        "not on a GKE pool; remove pool")


def test_gaudi_cannot_run_on_the_gke_cluster() -> None:
    found = problems("dev", {"workloads.g": {"kind": "mpijob", "accelerator": {"kind": "gaudi"}}})
    assert "workloads.g.accelerator.kind: gaudi needs an existing Gaudi cluster (GKE has no Gaudi nodes); " \
           "remove `cluster` and set kubeconfig or kubernetes.context" in found


@pytest.mark.parametrize(("change", "message"), [
    ({"workloads.j.pool": DELETE}, "workloads.j.pool: required for an NVIDIA workload; name a nodePools entry (t4)"),
    ({"workloads.j.pool": "l4"}, "workloads.j.pool: no nodePools entry is named 'l4' (known: t4)"),
    ({"workloads.j.accelerator.count": 2}, "workloads.j.accelerator.count: 2 GPUs per worker, but nodes of pool t4 "
                                           "have 1"),
    ({"workloads.j.workers": 4}, "workloads.j.workers: 4 worker(s) need 4 nodes of pool t4, but nodePools[0].maxNodes "
                                 "is 3; raise maxNodes or lower workers"),
])
def test_nvidia_pool_rules(change: dict[str, Any], message: str) -> None:
    changes = {"workloads.j": copy.deepcopy(NVIDIA_WORKLOAD), "workloads.j.workers": 1, "mpiOperator.install": True,
               **change}
    assert message in problems("dev", changes)


def test_nvidia_mpijob_needs_the_stacks_cluster() -> None:
    found = problems("gaudi", {"workloads.j": {"kind": "mpijob", "pool": "t4"}})
    assert "workloads.j.accelerator.kind: NVIDIA workloads run on a GPU pool of this stack's GKE cluster; set " \
           "`cluster` and `nodePools`, or run an MPIJob with accelerator.kind gaudi on an existing cluster" in found
    assert "workloads.j.pool: no nodePools entry is named 't4' (known: none)" in found


def test_read_write_once_claim_on_block_storage_is_an_error() -> None:
    # Block storage attaches to one node (Multi-Attach); NFS classes: tests/test_gaudi_cluster.py.
    found = only(problems("gaudi", {f"workloads.{GAUDI_JOB}.storage.accessMode": "ReadWriteOnce",
                                    f"workloads.{GAUDI_JOB}.storage.storageClass": "premium-rwo"}))
    assert found.startswith(
        f"workloads.{GAUDI_JOB}.storage.accessMode: ReadWriteOnce cannot be mounted by the launcher and 1 worker(s) "
        "on different nodes at once (premium-rwo is block storage (pd.csi.storage.gke.io): a second node gets a "
        "Multi-Attach error); use ReadWriteMany with an RWX storage class, or a file storage class (nfs-client, ")


@pytest.mark.parametrize(("path", "value", "message"), [
    ("storage.claimName", "Shared_Model", "storage.claimName: 'Shared_Model' is not a valid Kubernetes name"),
    ("storage.storageClass", "NFS", "storage.storageClass: 'NFS' is not a valid Kubernetes name"),
    ("namespace", "Workloads", "namespace: 'Workloads' is not a valid namespace (a DNS-1123 label)"),
    ("storage.mountPath", "storage", "storage.mountPath: 'storage' must be absolute"),
    ("hfHome", "/root/.cache/huggingface", "hfHome: /root/.cache/huggingface is not on the claim mounted at /storage"),
])
def test_claim_and_namespace_rules(path: str, value: str, message: str) -> None:
    found = only(problems("gaudi", {f"workloads.{GAUDI_JOB}.{path}": value}))
    assert found.startswith(f"workloads.{GAUDI_JOB}.{message}"), found


def test_last_worker_must_be_a_dns_1035_label() -> None:
    config = stack_yaml("gaudi")
    jobs = config["deepspeed-stack:workloads"]
    jobs["7b-finetune"] = jobs.pop(GAUDI_JOB)
    engine_cfg, _ = engine_config_from_yaml(config)
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set())
    assert only(err.value.problems).startswith(
        "workloads.7b-finetune: the MPI operator would name the last worker '7b-finetune-worker-0', which is not a "
        "DNS-1035 label")


def test_two_mpijobs_cannot_share_a_namespace() -> None:
    config = stack_yaml("gaudi")
    jobs = config["deepspeed-stack:workloads"]
    jobs["second"] = copy.deepcopy(jobs[GAUDI_JOB])
    engine_cfg, _ = engine_config_from_yaml(config)
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set())
    assert only(err.value.problems) == (
        "workloads.second.namespace: 'workloads' is also the namespace of gaudi-llm-ds-ft; each workload "
        "creates and deletes its own namespace, so give it one of its own")


def test_training_args_must_not_repeat_what_the_stack_sets() -> None:
    found = problems("gaudi", {f"workloads.{GAUDI_JOB}.training.args": ["--warmup_ratio", "0.1",
                                                                       "--per_device_train_batch_size=4"]})
    assert only(found) == (
        f"workloads.{GAUDI_JOB}.training.args[2]: --per_device_train_batch_size is set by the stack from "
        f"workloads.{GAUDI_JOB}.deepspeed.microBatchPerGpu; change it there instead")


def test_clipping_learning_rate_and_lora_in_args_point_to_their_keys() -> None:
    found = problems("gaudi", {f"workloads.{GAUDI_JOB}.training.args": ["--max_grad_norm", "0.3", "--lora_rank=4",
                                                                       "--learning_rate", "1e-4"]})
    assert found == [
        f"workloads.{GAUDI_JOB}.training.args[0]: --max_grad_norm is set by the stack from "
        f"workloads.{GAUDI_JOB}.deepspeed.gradientClipping; change it there instead",
        f"workloads.{GAUDI_JOB}.training.args[2]: --lora_rank is set by the stack from "
        f"workloads.{GAUDI_JOB}.training.lora.rank; change it there instead",
        f"workloads.{GAUDI_JOB}.training.args[3]: --learning_rate is set by the stack from "
        f"workloads.{GAUDI_JOB}.deepspeed.learningRate; change it there instead",
    ]


def test_lora_flags_only_when_enabled() -> None:
    m = model("gaudi", {f"workloads.{GAUDI_JOB}.training.lora": {"enabled": False}})
    train = container(render(m, GAUDI_JOB), "Launcher")["args"][0].splitlines()[-1]
    assert "--lora_" not in train
    assert "--learning_rate 0.0003" in train


def test_nvidia_launch_script_must_exist() -> None:
    changes = {"workloads.j": {**copy.deepcopy(NVIDIA_WORKLOAD), "workers": 1, "launch": {"script": "nope.py"}},
               "mpiOperator.install": True, "nodePools[0].maxNodes": 4}
    assert only(problems("dev", changes)).startswith(
        "workloads.j.launch.script: no file 'nope.py' in recipes (there: ")


def test_nfs_provisioner_rules() -> None:
    found = problems("gaudi", {"nfsProvisioner": {"install": True, "storageClass": "NFS_Client", "path": "exports"}})
    assert found == [
        "nfsProvisioner.server: required when nfsProvisioner.install is true (the NFS server's address, e.g. "
        "10.0.0.5 or nfs.example.internal)",
        "nfsProvisioner.storageClass: 'NFS_Client' is not a valid StorageClass name (a DNS-1123 subdomain)",
        "nfsProvisioner.path: 'exports' must be an absolute path on the NFS server",
    ]


def test_launcher_policy_only_for_operators_that_know_it() -> None:
    new = render(model("gaudi", {"mpiOperator.version": "v0.8.0"}), GAUDI_JOB)
    assert new["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    m = model("gaudi")  # Omnia 1.7's operator
    assert m.mpi_operator.version == "v0.4.0"
    w = m.workloads[GAUDI_JOB]
    old = mpijob.render(mpijob.MpiJobInputs(workload=w, placement=placement(m, w), image=GAUDI_IMAGE,
                                            config_map="cm", operator_version="v0.4.0"), w.namespace)
    assert "launcherCreationPolicy" not in old["spec"]
    # What the v0.4.0 CRD would refuse under a server-side apply: nothing.
    schema = crd_schema("v0.4.0")
    assert unknown_fields(schema, old) == []


def test_launcher_waits_for_every_worker_on_ssh(gaudi_job: dict[str, Any]) -> None:
    script = container(gaudi_job, "Launcher")["args"][0]
    assert 'ssh -o ConnectTimeout=5 -o BatchMode=yes "$host" true' in script
    assert "tries=120" in script


def test_the_stack_installs_only_the_pinned_operator() -> None:
    assert problems("gaudi", {"mpiOperator.install": True, "mpiOperator.version": "v0.4.0"}) == [
        "mpiOperator.version: the stack installs v0.8.0 only, got v0.4.0; set v0.8.0, or install: false when the "
        "cluster already runs v0.4.0"]


def test_the_accelerator_picks_the_path_once() -> None:
    # One place decides (mpijob.path_of): kind mpijob on Gaudi takes the Gaudi path, every other MPIJob (kind mpijob
    # on NVIDIA, kind finetune) the NVIDIA one; the five functions below it only delegate.
    gaudi_w = model("gaudi").workloads[GAUDI_JOB]
    nvidia_w = model("dws").workloads["pretrain"]
    tune = model("finetune").workloads["tune"]
    assert type(mpijob.path_of(gaudi_w)).__name__ == "_Gaudi"
    assert [type(mpijob.path_of(w)).__name__ for w in (nvidia_w, tune)] == ["_Nvidia", "_Nvidia"]
    # The module's functions are the picked path's: the Gaudi image, not the stack's.
    where = placement(model("gaudi"), gaudi_w)
    assert mpijob.launcher_image(gaudi_w, "stack-image@sha256:x", GAUDI_IMAGE) == GAUDI_IMAGE
    assert mpijob.config_map_data(gaudi_w, where, has_token=False) == \
        mpijob.path_of(gaudi_w).config_map_data(where, False, None)
