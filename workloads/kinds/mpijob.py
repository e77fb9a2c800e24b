"""kind mpijob: a Kubeflow v2beta1 MPIJob, on NVIDIA GPUs of a GKE pool or on Gaudi nodes of an existing cluster.

Config: MpiJobWorkloadConfig (model/workload_training.py; its keys: the common ones, `launch`, `deepspeed`, `gaudi`,
`hostIPC`, `training`, `storage`, `hfHome`, `proxy`). Builder: the TrainingJob component (workloads/training_job.py)
around the MPIJob that workloads/mpijob renders. Summary: the job, its namespace, claim, accelerators and workers
(`workloads.<name>`). Kueue queues it on a stack GPU pool when `kueue.install` is on.
"""

from __future__ import annotations

import functools

import pulumi

from model import catalog as gpu_catalog
from model import gaudi_software, storage_classes
from model.config_schema import kind_branches, schema, with_defaults, workload_default
from model.problems import Problem
from model.suggest import closest
from model.types import MpiJobBaseConfig, MpiJobWorkloadConfig, StackConfig, TrainingConfig, camel
from model.types import build as build_config
from model.validators import DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MAX, at, bucket_path_problem
from workloads import gaudi_training, mpijob, recipe_rules
from workloads.kinds.kind import Built, Kind, Platform
from workloads.kinds.shared import (
    changed_keys,
    deepspeed_config_flag,
    script_flag_problems,
    warn_learning_rate_unused,
)
from workloads.kueue import queue_name
from workloads.mpijob import script_source
from workloads.placement import placement
from workloads.training_job import TrainingJob, TrainingJobArgs


def check_gaudi_placement(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """Gaudi MPIJobs run on an existing cluster, on no GKE pool (NVIDIA placement: check_gpu_pool_placement)."""
    if not w.on_gaudi:
        return []
    problems = []
    if w.pool is not None:
        problems.append(Problem(at('workloads', w.name, 'pool'), "a Gaudi MPIJob runs on habana.ai/gaudi nodes of an "
                        "existing cluster, not on a GKE pool; remove pool"))
    if m.cluster is not None:
        problems.append(Problem(at('workloads', w.name, 'accelerator', 'kind'), "gaudi needs an existing Gaudi cluster "
                        "(GKE has no Gaudi nodes); remove `cluster` and set kubeconfig or kubernetes.context"))
    cards = gpu_catalog.load().gaudi.get(w.accelerator.type, {}).get("cardsPerNode")
    if cards is not None and w.accelerator.count is not None and w.accelerator.count > cards:
        problems.append(Problem(at('workloads', w.name, 'accelerator', 'count'),
                                f"{w.accelerator.count} cards per worker, "
                        f"but a {w.accelerator.type} node has {cards} (data/gpu_catalog.yaml); use at most {cards} "
                        "and more `workers` for more cards"))
    return problems


def check_launch_script(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """An NVIDIA MPIJob's ranks run `launch.script`: shipped from recipes (or its user/ folder) in the
    job's ConfigMap, or a file of the bucket or the image (a Gaudi job runs optimum-habana's `training.script` from
    its image)."""
    return script_source.problems(m, w) if w.on_nvidia else []


def check_launch_args(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """An NVIDIA MPIJob's `launch.args` are flags its script's parser has, and the parser takes what the stack
    passes (--deepspeed_config, DeepSpeed's --local_rank): else every rank stops at start-up."""
    return script_flag_problems(w, deepspeed_config_flag(m, w)) if w.on_nvidia else []


def check_mpijob_name(m: StackConfig, w: MpiJobBaseConfig) -> list[Problem]:
    """The operator names pods (and their host names) `<job>-worker-<i>`: the last must be a DNS-1035 label."""
    host = mpijob.worker_pod_name(w.name, w.workers)
    if mpijob.DNS1035_LABEL.match(host) and len(host) <= mpijob.DNS_LABEL_MAX:
        return []
    return [Problem(at('workloads', w.name), f"the MPI operator would name the last worker {host!r}, which is not a "
            f"DNS-1035 label (start with a letter; lowercase letters, digits, hyphens; at most "
            f"{mpijob.DNS_LABEL_MAX} characters); shorten or rename the workload")]


def file_storage(m: StackConfig, storage_class: str) -> bool:
    """NFS or Filestore: the class is recorded as file storage, or it is the stack's own NFS provisioner's."""
    own = m.nfs_provisioner.install and m.nfs_provisioner.storage_class == storage_class
    return own or storage_classes.is_file_storage(storage_class)


def check_mpijob_storage(m: StackConfig, w: MpiJobBaseConfig) -> list[Problem]:
    """The shared claim: mountable by launcher and workers at once, a valid name, HF_HOME on it."""
    problems, s, name = [], w.storage, w.name
    if s.access_mode == "ReadWriteOnce" and not file_storage(m, s.storage_class):
        known = storage_classes.storage_classes().get(s.storage_class)
        what = (f"{s.storage_class} is {known.storage} storage ({known.provisioner})" if known else
                f"{s.storage_class} is not recorded as file storage in data/storage_classes.yaml, so it is taken "
                "for block storage")
        problems.append(Problem(at('workloads', name, 'storage', 'accessMode'), f"ReadWriteOnce cannot be mounted by "
                        f"the launcher and {w.workers} worker(s) on different nodes at once ({what}: a second node "
                        "gets a Multi-Attach error); use ReadWriteMany with an RWX storage class, or a file storage "
                        f"class ({', '.join(storage_classes.file_classes())}), where ReadWriteOnce is fine"))
    for key, value in (("claimName", s.claim_name), ("storageClass", s.storage_class)):
        if not DNS1123_SUBDOMAIN.match(value) or len(value) > DNS1123_SUBDOMAIN_MAX:
            problems.append(Problem(at('workloads', name, 'storage', key), f"{value!r} is not a valid Kubernetes name "
                            "(a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"))
    mount = s.mount_path.rstrip("/") or "/"
    if not s.mount_path.startswith("/"):
        problems.append(Problem(at('workloads', name, 'storage', 'mountPath'), f"{s.mount_path!r} must be absolute"))
    elif w.cache_home != mount and not w.cache_home.startswith(mount.rstrip("/") + "/"):
        problems.append(Problem(at('workloads', name, 'hfHome'), f"{w.cache_home} is not on the claim mounted at "
                        f"{s.mount_path}; every pod would download the model again"))
    return problems


def check_training_args(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """Flags the stack sets from other keys may not be repeated: a second batch size or precision would
    disagree with ds_config.json, and the HF Trainer refuses to start on such a mismatch. Flags the launcher passes
    itself, or that it overrides (your own data: run_lora_clm.py loads --dataset_name before --train_file), would
    be lost without a word: each is refused with what to use instead."""
    if not w.on_gaudi or w.launch.command or w.finetune is not None:
        return []
    problems = []
    for i, arg in enumerate(w.training.args):
        key, flag = at('workloads', w.name, 'training', 'args', i), arg.split('=', 1)[0]
        source = mpijob.reserved_flag(arg)
        if source:
            problems.append(Problem(key,
                                    f"{flag} is set by the stack from {at('workloads', w.name, *source)}; change it "
                                    "there instead"))
        elif (instead := mpijob.gaudi.LAUNCHER_FLAGS.get(flag)) is not None:
            problems.append(Problem(key, f"{flag} {instead.format(w=at('workloads', w.name))}"))
    return problems


# What a file of data is named (finetune.py's SUFFIXES and run_lora_clm.py's --train_file kinds): a
# `training.dataset` ending so is a file, not a Hugging Face id, whatever its slash says.
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".csv", ".arrow")


def check_training_dataset_is_a_hub_id(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """`training.dataset` goes to run_lora_clm.py's --dataset_name, which the Hub is asked for: `data/train.jsonl`
    has the form of an id (OWNER/NAME) but names a file, which would be looked for on the Hub and fail after the
    model's download. Your file belongs on the claim, read by the recipe."""
    dataset = w.training.dataset
    if not w.on_gaudi or w.launch.command or w.finetune is not None or not dataset.lower().endswith(
            DATA_FILE_SUFFIXES):
        return []
    return [Problem(at('workloads', w.name, 'training', 'dataset'),
                    f"{dataset!r} names a file, but training.dataset is a "
            "Hugging Face dataset id (run_lora_clm.py's --dataset_name, looked up on the Hub). Put the file on the "
            f"claim and set {at('workloads', w.name, 'finetune', 'datasetPath')} to its path under "
            "storage.mountPath, with finetune.model in place of training (the recipe, finetune.py on HPU)")]


def _recipe_site(w: MpiJobWorkloadConfig) -> recipe_rules.RecipeSite:
    assert w.finetune is not None
    return recipe_rules.RecipeSite(run=w.finetune, prefix=("workloads", w.name), deepspeed=w.deepspeed,
                             data_where="the claim")


# `training`'s keys and where each one's meaning went in the recipe's keys (the migration the refusal names).
TRAINING_TO_RECIPE: dict[str, str | None] = {
    "model": "finetune.model (or finetune.modelPath, a folder on the claim)",
    "dataset": "finetune.dataset (or finetune.datasetPath, your file or folder on the claim)",
    "epochs": "finetune.epochs (or finetune.maxSteps)", "script": None,  # the recipe is finetune.py itself
    "lora": "finetune.lora (rank, alpha, dropout, targetModules, export)",
    "args": "launch.args (more finetune.py flags)",
}


def check_gaudi_recipe(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """`finetune` on a Gaudi MPIJob: the recipe's rules (the same keys and rules as on GKE and Vertex AI), its paths
    on the claim, and `training` (optimum-habana's example, which it replaces) not written at all, not even at a
    default value; the image's optimum-habana (`training.optimumHabanaVersion`) still applies."""
    if w.finetune is None:
        return []
    key = at("workloads", w.name, "finetune")
    if not w.on_gaudi:
        return [Problem(key,
                        "the recipe on NVIDIA GPUs is kind finetune (same `finetune` keys, data in the bucket); set "
                        "kind: finetune, or remove finetune")]
    if w.launch.command:
        return [Problem(at('workloads', w.name, 'launch', 'command'), "replaces the recipe's run that `finetune` "
                "configures (finetune.py with its keys' arguments); remove launch.command or finetune")]
    site = _recipe_site(w)
    problems = recipe_rules.problems(site) + recipe_rules.path_problems(
        site, w.finetune, claim_path_problem,
        lambda key, path, why: Problem(key,
                                       f"{path!r} {why} (the pods see the claim at {w.storage.mount_path}; copy your "
                                       "data onto it)"))
    defaults = _training_defaults()
    for field, instead in TRAINING_TO_RECIPE.items():
        # Written, even at its default (`training.epochs: 3` beside finetune.epochs: 1 would be a silent 1-epoch
        # run), or changed (a model built without the reader's record).
        if camel(field) in w.training.written or getattr(w.training, field) != getattr(defaults, field):
            use = f"use {at('workloads', w.name)}.{instead}, and " if instead else "the ranks run finetune.py; "
            problems.append(Problem(at('workloads', w.name, 'training', camel(field)),
                                    f"not used with {key}: the recipe "
                                    f"(finetune.py on HPU) replaces training's optimum-habana example; {use}remove "
                                    f"training.{camel(field)}"))
    args_key = ("workloads", w.name, "launch", "args")
    return [*problems, *recipe_rules.check_args(site, args_key, w.launch.args),
            *recipe_rules.check_args_known(args_key, w.launch.args)]


def claim_path_problem(path: str) -> str | None:
    """Why a path relative to the claim's mount would name something off the claim: the bucket's rule (`..` climbs
    out, an absolute path is the pod's own file system), in the claim's words."""
    return bucket_path_problem(path, "the claim")


@functools.cache
def _training_defaults() -> TrainingConfig:
    """`training` as the schema's defaults fill it: what a stack file that never set it gets."""
    node = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])["mpijob"]
    return build_config(TrainingConfig, with_defaults(node["properties"]["training"], {}))


def check_training_on_nvidia(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """`training` is the Gaudi run's (optimum-habana's script, model, dataset, epochs, LoRA): an NVIDIA MPIJob runs
    `launch.script` and would silently ignore it. A key written (at any value) or changed is refused, pointing at
    the kind that does fine-tune on NVIDIA."""
    if not w.on_nvidia:
        return []
    defaults, problems = _training_defaults(), []
    for field in TrainingConfig.__struct_fields__:
        if field != "written" and (camel(field) in w.training.written or
                                   getattr(w.training, field) != getattr(defaults, field)):
            key = at("workloads", w.name, "training", camel(field))
            problems.append(Problem(key, "`training` is the Gaudi fine-tuning run's (optimum-habana); an NVIDIA MPIJob "
                            "runs launch.script and would ignore it. Fine-tune on NVIDIA with kind finetune "
                            "(finetune.model, finetune.dataset or datasetPath, finetune.epochs, finetune.lora), or "
                            "pass your script its arguments in launch.args"))
    return problems


def check_gaudi_env(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """`env` reaches a Gaudi job's ranks (workloads/mpijob/gaudi_env.py); a name the stack sets would fight it, and an
    NVIDIA MPIJob does not read the key."""
    if w.env and w.on_nvidia:
        return [Problem(at('workloads', w.name, 'env'), "`env` is the Gaudi MPIJob's (every rank's environment through "
                "DeepSpeed's DS_ENV_FILE); an NVIDIA MPIJob would ignore it. Remove it")]
    return [Problem(at('workloads', w.name, 'env', name), f"set by {owner}; the stack sets {name} itself, choose "
            "another name or change it there") for name in w.env if (owner := mpijob.gaudi_env.stack_env_owner(name))]


def check_gaudi_launch_unused(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """A Gaudi MPIJob without `launch.command` runs optimum-habana's `training.script` with `training.args`
    (workloads/mpijob/gaudi_launcher.py): `launch.script` and `launch.args` would be silently ignored."""
    if not w.on_gaudi or w.launch.command:
        return []
    problems = []
    if w.launch.args and w.finetune is None:
        problems.append(Problem(at('workloads', w.name, 'launch', 'args'),
                                f"not used: a Gaudi MPIJob runs training.script "
                        f"({w.training.script}) with {at('workloads', w.name, 'training', 'args')}; put them there, "
                        "or run your own command with launch.command"))
    if w.launch.script != workload_default(w.kind, "launch", "script") and w.finetune is not None:
        problems.append(Problem(at('workloads', w.name, 'launch', 'script'),
                                "not used: with finetune the ranks run the "
                                "stack's finetune.py; remove launch.script"))
    elif w.launch.script != workload_default(w.kind, "launch", "script"):
        problems.append(Problem(at('workloads', w.name, 'launch', 'script'), f"not used: a Gaudi MPIJob runs "
                        f"optimum-habana's {at('workloads', w.name, 'training', 'script')} ({w.training.script}); "
                        "set that, or run your script with launch.command"))
    return problems


def warn_gaudi_keys_on_nvidia(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """`gaudi` picks the Gaudi image's software; an NVIDIA MPIJob runs the stack's image and never reads it."""
    if not w.on_nvidia:
        return []
    return [Problem(at('workloads', w.name, 'gaudi', key), "not used: `gaudi` picks a Gaudi job's software, and this "
            "MPIJob runs on NVIDIA GPUs with the stack's image") for key in
            changed_keys(w.gaudi, workload_default(w.kind, "gaudi"))]


def warn_training_under_command(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """On Gaudi, `launch.command` replaces optimum-habana's run, the one `training` configures."""
    if not (w.on_gaudi and w.launch.command):
        return []
    defaults = workload_default(w.kind, "training")
    return [Problem(at('workloads', w.name, 'training', key), "not used: launch.command replaces optimum-habana's run "
            "that `training` configures; pass it in your command") for key in
            dict.fromkeys([*changed_keys(w.training, defaults, ("written",)),
                          *(k for k in w.training.written if k != "optimumHabanaVersion")])]


def warn_nvidia_learning_rate(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    # A Gaudi job passes deepspeed.learningRate as --learning_rate (workloads/mpijob/gaudi_launcher.py).
    return warn_learning_rate_unused(w) if w.on_nvidia else []


def closest_hccl(name: str, prefixes: tuple[str, ...], known: tuple[str, ...]) -> str | None:
    """The documented name `name` most likely meant, compared without the prefix they share (every HCCL_ name
    would otherwise look alike)."""
    def bare(text: str) -> str:
        return next((text[len(p):] for p in prefixes if text.startswith(p)), text)

    match = closest(bare(name), [bare(k) for k in known])
    return next((k for k in known if bare(k) == match), None) if match else None


def warn_unknown_hccl_env(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    """An `env` name of HCCL's that Habana does not document (data/hccl_env.yaml): likely misspelt, and HCCL
    ignores a name it does not read, so the setting would change nothing without a word."""
    if not w.on_gaudi:
        return []
    prefixes, known = gaudi_software.hccl_env()
    out = []
    for name in w.env:
        if name.startswith(prefixes) and name not in known:
            match = closest_hccl(name, prefixes, known)
            out.append(Problem(at('workloads', w.name, 'env', name), f"not an HCCL variable Habana documents "
                       "(data/hccl_env.yaml), and HCCL reads only the names it knows, so this one would change "
                       f"nothing{f'; did you mean {match}?' if match else ''}"))
    return out


def warn_install_at_start(m: StackConfig, w: MpiJobWorkloadConfig) -> list[Problem]:
    if not w.installs_at_start:
        return []
    return [Problem(at('workloads', w.name, 'gaudi', 'installAtStart'), "Omnia's original path: optimum-habana and "
            "Habana's DeepSpeed are installed from GitHub and PyPI on every node at every start, as root, in pods "
            "that cannot be hardened (docs/workloads.md, \"Opt-in: install at start\")")]


def build(name: str, w: MpiJobWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    cfg = platform.cfg
    queue = queue_name(cfg, w)
    job = TrainingJob(name, TrainingJobArgs(
        config=w, placement=placement(cfg, w), stack_image=platform.image, hf_token=platform.hf_token,
        claim_depends_on=platform.claim_depends_on, bucket=platform.bucket,
        operator_version=cfg.mpi_operator.version, gaudi_image=platform.gaudi_image,
        registry=platform.gaudi_login if w.on_gaudi else None,
        retain_on_delete=not platform.own_cluster, adopt_provider=platform.adopt_with, queue=queue,
        admitted_by=platform.mpijob_admitted_by(queue is not None)), opts)
    summary = job.summary
    if w.finetune is not None:  # the recipe's layout on the claim: where the result is fetched from
        outputs = gaudi_training.summary(w, placement(cfg, w).per_worker)
        summary = job.summary.apply(lambda s: {**s, **outputs})
    return Built(job, summary, queued_namespace=job.namespace.metadata.name if queue else None)


KIND: Kind[MpiJobWorkloadConfig] = Kind(
    name="mpijob",
    config=MpiJobWorkloadConfig,
    rules=(check_gaudi_placement, check_launch_script, check_launch_args, check_mpijob_name, check_mpijob_storage,
           check_training_args, check_training_on_nvidia, check_gaudi_launch_unused, check_gaudi_env,
           check_gaudi_recipe, check_training_dataset_is_a_hub_id),
    build=build,
    warnings=(warn_install_at_start, warn_gaudi_keys_on_nvidia, warn_training_under_command, warn_nvidia_learning_rate,
              warn_unknown_hccl_env),
)
