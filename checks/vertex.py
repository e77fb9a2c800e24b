"""Pre-deploy checks for storage and Vertex AI, one function per rule."""

from __future__ import annotations

import json
import re

from checks.common import Check, at, or_list
from checks.platform import machine_problems
from components.storage import CHECKPOINT_PREFIX
from model import catalog as gpu_catalog
from model import network_pricing
from model.config_schema import schema
from model.pair_rules import PairRule, pair_problems
from model.problems import Problem
from model.suggest import did_you_mean
from model.types import StackConfig, snake
from model.validators import bucket_name_problem, bucket_path_problem
from planner.recovery import stack_recovery
from workloads import recipe_rules, vertex_job

K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_vertex_needs_storage(m: StackConfig) -> list[Problem]:
    if m.vertex.enabled and not m.storage.enabled:
        return [Problem("vertex.enabled",
                        "Vertex AI runs read and write through the stack's bucket; set storage.enabled: true")]
    return []


def check_vertex_machine(m: StackConfig) -> list[Problem]:
    if not m.vertex.enabled:
        return []
    v = m.vertex
    if v.gpu.type not in gpu_catalog.load().gpus:
        known = gpu_catalog.load().gpus
        return [Problem("vertex.gpu.type", f"unknown GPU type {v.gpu.type!r}; known: {', '.join(known)}"
                f"{did_you_mean(v.gpu.type, known)}")]
    problems = machine_problems(["vertex"], v.gpu.type, v.machine_type, v.gpu.count)
    if m.region and not gpu_catalog.load().zones(v.gpu.type, m.region):
        problems.append(Problem("vertex.gpu.type", f"{v.gpu.type} is not offered in {m.region}"))
    return problems


def _vertex_site(m: StackConfig) -> recipe_rules.RecipeSite | None:
    """`vertex.finetune` as the recipe's rules see it (None without it)."""
    v = m.vertex
    if not v.enabled or v.finetune is None:
        return None
    return recipe_rules.RecipeSite(run=v.finetune, prefix=vertex_job.STACK_PREFIX, deepspeed=v.deepspeed,
                             data_where="the bucket")


def check_vertex_recipe(m: StackConfig) -> list[Problem]:
    """`vertex.finetune`: the recipe's rules (the same as on GKE and Gaudi), its paths in the bucket, and the name
    its outputs are filed under."""
    site = _vertex_site(m)
    if site is None:
        return []
    problems = recipe_rules.problems(site) + recipe_rules.path_problems(
        site, site.run, bucket_path_problem,
        lambda key, path, why: Problem(key, f"the bucket path {path!r} {why} (Vertex AI shows the bucket at "
                               f"{vertex_job.VERTEX_MOUNT}/<bucket>)"))
    name = m.vertex.display_name
    if not K8S_NAME.match(name):
        problems.append(Problem("vertex.displayName", f"{name!r} names the run's folders with vertex.finetune "
                        f"(checkpoints/{name}, models/{name} in the bucket): use lowercase letters, digits and "
                        "hyphens, e.g. deepspeed-training"))
    return problems


def check_vertex_launch_with_recipe(m: StackConfig) -> list[Problem]:
    """With `vertex.finetune` the replicas run the stack's finetune.py: `launch.script` would be silently replaced,
    and `launch.args` are more finetune.py flags, never one the stack sets from a key (argparse would take the last
    one and the key would silently lose) nor one the script lacks."""
    site = _vertex_site(m)
    if site is None:
        return []
    v, problems = m.vertex, []
    default_script = schema()["properties"]["vertex"]["properties"]["launch"]["properties"]["script"]["default"]
    if v.launch.script != default_script:
        problems.append(Problem("vertex.launch.script",
                                f"not used: with vertex.finetune every replica runs the stack's "
                                f"finetune.py (uploaded to gs://<bucket>/{vertex_job.RECIPE_PREFIX}/); remove "
                                "vertex.launch.script, or remove vertex.finetune to run your own script"))
    args_key = ("vertex", "launch", "args")
    # A launcher option or --local_rank is check_vertex_launcher_args' (one problem per key).
    theirs = {at(*args_key, i) for i, arg in enumerate(v.launch.args)
              if vertex_job.launcher_arg_problem(arg.split("=", 1)[0]) is not None}
    mine = [*recipe_rules.check_args(site, args_key, v.launch.args),
            *recipe_rules.check_args_known(args_key, v.launch.args)]
    return [*problems, *(p for p in mine if p.path not in theirs)]


def check_vertex_launcher_args(m: StackConfig) -> list[Problem]:
    """`vertex.launch.args` go to the script after its name: a deepspeed launcher option there never reaches the
    launcher, and a --local_rank would override the launcher's on every rank (data/deepspeed_launcher.yaml)."""
    if not m.vertex.enabled:
        return []
    return [Problem(at('vertex', 'launch', 'args', i), f"{flag} {why}") for i, arg in enumerate(m.vertex.launch.args)
            if (why := vertex_job.launcher_arg_problem(flag := arg.split("=", 1)[0])) is not None]


def check_vertex_deepspeed_unused(m: StackConfig) -> list[Problem]:
    """`vertex.deepspeed` is the recipe's ds_config.json: without `vertex.finetune` the user's script reads none of
    it (its own flags, e.g. --zero_stage, say how it trains)."""
    v = m.vertex
    if not v.enabled or v.finetune is not None:
        return []
    defaults = schema()["properties"]["vertex"]["properties"]["deepspeed"]["properties"]
    changed = [key for key, node in defaults.items() if "default" in node
               and getattr(v.deepspeed, snake(key)) != node["default"]]
    changed += [key for key, node in defaults.items() if "default" not in node
                and getattr(v.deepspeed, snake(key)) is not None]
    return [Problem(f"vertex.deepspeed.{key}",
                    f"not used: vertex.deepspeed is the ds_config.json of vertex.finetune's run; "
                    f"your script ({v.launch.script}) takes its settings in vertex.launch.args. Remove it, or set "
                    "vertex.finetune to run the stack's recipe") for key in changed]


# The GCS FUSE mount is of the stack's bucket, through GKE's CSI driver and Workload Identity.
GCS_FUSE_NEEDS = (
    PairRule("gcsFuse.enabled", "needs the stack's bucket; set storage.enabled: true", needs="/storage.enabled"),
    PairRule("gcsFuse.enabled", "the GCS FUSE CSI driver and Workload Identity are GKE features; this stack has no "
             "`cluster`", needs="/cluster"),
)


def check_gcs_fuse_needs_storage_and_gke(m: StackConfig) -> list[Problem]:
    return pair_problems(m, "workloads", GCS_FUSE_NEEDS)


# Paths every workload's pods may use: the chart's source at /app, scratch, shared memory (and each workload's own:
# its claim, the offload path: `mount_paths`).
RESERVED_MOUNTS = ("/app", "/tmp", "/dev/shm", "/job", "/etc/deepspeed")


def check_gcs_fuse_mount_path(m: StackConfig) -> list[Problem]:
    problems = []
    for name, w in m.workloads.items():
        path = w.gcs_fuse.mount_path.rstrip("/") or "/"
        taken = {*RESERVED_MOUNTS, *(p.rstrip("/") for p in w.mount_paths)}
        if w.gcs_fuse.enabled and path in taken | {"/"}:
            problems.append(Problem(f"workloads.{name}.gcsFuse.mountPath",
                                    f"{path} is already used by the workload's pods; "
                                    "pick another path such as /gcs"))
    return problems


def check_storage_names(m: StackConfig) -> list[Problem]:
    if not m.storage.enabled:
        return []
    problems = []
    if not K8S_NAME.match(m.storage.kubernetes_service_account):
        problems.append(Problem("storage.kubernetesServiceAccount",
                                f"{m.storage.kubernetes_service_account!r} is not a "
                                "Kubernetes name (lowercase letters, digits, hyphens)"))
    for key, name in (("bucketName", m.storage.bucket_name), ("existingBucket", m.storage.existing_bucket)):
        why = bucket_name_problem(name) if name is not None else None
        if why:
            problems.append(Problem(f"storage.{key}",
                                    f"{name!r} is not a valid bucket name: {why} (Cloud Storage's naming rules)"))
    return problems


# The settings of a bucket the stack creates; an existing bucket keeps its own (the stack changes none of them).
OWN_BUCKET_SETTINGS = {"bucketName": "bucket_name", "location": "location", "versioning": "versioning",
                       "softDeleteDays": "soft_delete_days", "checkpointRetentionDays": "checkpoint_retention_days"}


def check_existing_bucket_settings(m: StackConfig) -> list[Problem]:
    """`existingBucket` names a bucket the stack did not create: a setting of the stack's own bucket given with it
    would be silently ignored (the stack never changes that bucket), so it is refused. Defaults stand for unset."""
    if not (m.storage.enabled and m.storage.existing_bucket):
        return []
    keys = schema()["properties"]["storage"]["properties"]
    problems = []
    for key, field in OWN_BUCKET_SETTINGS.items():
        value = getattr(m.storage, field)
        if value is not None and value != keys[key].get("default"):
            problems.append(Problem(f"storage.{key}",
                                    f"a setting of a bucket the stack creates, but storage.existingBucket "
                            f"names {m.storage.existing_bucket!r}, whose settings the stack never changes; remove "
                            f"{key} (or set it on the bucket yourself)"))
    return problems


def _own_bucket_default(key: str) -> int:
    return schema()["properties"]["storage"]["properties"][key]["default"]


def warn_existing_bucket_lifecycle(m: StackConfig) -> list[Problem]:
    """A bucket the stack did not create gets none of its own bucket's housekeeping (components/storage.py): no
    rule deletes old checkpoints, and soft delete stays as the bucket has it. Nothing fails, but checkpoints of
    every run pile up and are billed; the warning says what the stack would have set and the gcloud command that
    sets it (the stack never changes a bucket it does not own)."""
    bucket = m.storage.existing_bucket
    if not (m.storage.enabled and bucket):
        return []
    days, soft = _own_bucket_default("checkpointRetentionDays"), _own_bucket_default("softDeleteDays")
    rule = json.dumps({"rule": [{"action": {"type": "Delete"},
                                 "condition": {"age": days, "matchesPrefix": [CHECKPOINT_PREFIX]}}]},
                      separators=(",", ":"))
    return [Problem("storage.existingBucket",
                    f"the stack applies no retention or lifecycle setting to {bucket!r}, a bucket it "
            f"did not create: no rule deletes objects under {CHECKPOINT_PREFIX} (its own bucket deletes them after "
            f"storage.checkpointRetentionDays, {days} days), and soft delete and versioning stay as the bucket has "
            f"them (its own: {soft} days, off). To set the same yourself: `echo '{rule}' "
            f"> lifecycle.json && gcloud storage buckets update gs://{bucket} --lifecycle-file=lifecycle.json "
            f"--soft-delete-duration={soft}d` (--lifecycle-file replaces the bucket's rules: add those it has, from "
            f"`gcloud storage buckets describe gs://{bucket} --format='default(lifecycle_config)'`)")]


def _bucket_readers(m: StackConfig) -> list[str]:
    """Who reads and writes the stack's bucket from GPUs in gcp:region: NVIDIA workloads that mount it (GCS FUSE)
    and the Vertex AI job (its /gcs mount)."""
    readers = [at("workloads", name) for name, w in sorted(m.workloads.items()) if w.on_nvidia and w.gcs_fuse.enabled]
    return readers + (["the Vertex AI job (/gcs)"] if m.vertex.enabled else [])


def warn_bucket_region(m: StackConfig) -> list[Problem]:
    """A bucket in another location than the GPUs still works, but every checkpoint written and every read crosses
    regions: billed per GiB (data/network_pricing.yaml) and slower than the region's own. With a 70B model's full
    checkpoint near 1 TB, that is a bill per save; the warning names the rate and each workload's checkpoint at it."""
    location = m.storage.location
    readers = _bucket_readers(m)
    if not (m.storage.enabled and location and readers and m.region):
        return []
    prices = network_pricing.load()
    move = prices.transfer(location, m.region)
    if move.scope == "same":
        return []
    if move.per_gib is not None:
        rate = (f"${move.per_gib:g} per GiB each way (Cloud Storage's data transfer between locations on one "
                f"continent, data/network_pricing.yaml; an assumption until confirmed)")
    else:
        rate = (f"intercontinental rates ({move.bucket_continent or '?'} to {move.region_continent or '?'}: Cloud "
                "Storage's general network table, more than within a continent; not kept in "
                "data/network_pricing.yaml)")
    sizes = {name: run["checkpointGb"] for name, run in stack_recovery(m).items()
             if m.workloads[name].gcs_fuse.enabled}
    saves = [f"{name}'s ({gb:,.0f} GB) about ${gb * 1e9 / 2**30 * move.per_gib:,.2f}" if gb >= 10 else
             f"{name}'s ({gb:.2g} GB) about ${gb * 1e9 / 2**30 * move.per_gib:,.2f}"
             for name, gb in sizes.items()] if move.per_gib is not None else []
    holding = [name for name in [*prices.dual_regions, *prices.multi_regions] if prices.contains(name, m.region)]
    return [Problem("storage.location", f"the bucket is in {location} and the GPUs in {m.region}, so what mounts it "
            f"({', '.join(readers)}) reads and writes across regions, at {rate} and at inter-region bandwidth"
            + (f"; one checkpoint costs {', '.join(saves)} to write" if saves else "")
            + f". Leave storage.location unset (the bucket then goes to {m.region}) or set {m.region}"
            + (f" (or {or_list(holding)}, which contain it)" if holding else ""))]


def warn_vertex_dataset_tokens_unread(m: StackConfig) -> list[Problem]:
    """`vertex.finetune.datasetTokens` feeds the run's estimate; with maxSteps the estimate counts maxSteps x the
    global batch x sequenceLength instead, and says so (as a GKE finetune workload's)."""
    f = m.vertex.finetune if m.vertex.enabled else None
    if f is None or f.dataset_tokens is None or f.max_steps is None:
        return []
    key = "vertex.finetune"
    return [Problem(f"{key}.datasetTokens",
                    f"not used: with {key}.maxSteps the run trains maxSteps x the global batch x "
                    "sequenceLength tokens, what the preview's estimate counts")]


def warnings(m: StackConfig) -> list[Problem]:
    return warn_existing_bucket_lifecycle(m) + warn_bucket_region(m) + warn_vertex_dataset_tokens_unread(m)


def check_soft_delete_days(m: StackConfig) -> list[Problem]:
    days = m.storage.soft_delete_days
    if m.storage.enabled and 0 < days < 7:
        return [Problem("storage.softDeleteDays",
                        f"Cloud Storage keeps deleted objects 7 to 90 days (or 0: off), got {days}")]
    return []


def check_storage_needs_project(m: StackConfig) -> list[Problem]:
    if (m.storage.enabled or m.vertex.enabled) and not (m.project and m.region):
        return [Problem("storage.enabled", "the bucket and Vertex AI need gcp:project and gcp:region")]
    return []


CHECKS: list[Check] = [
    check_vertex_needs_storage,
    check_vertex_machine,
    check_vertex_recipe,
    check_vertex_launch_with_recipe,
    check_vertex_deepspeed_unused,
    check_vertex_launcher_args,
    check_gcs_fuse_needs_storage_and_gke,
    check_gcs_fuse_mount_path,
    check_storage_names,
    check_existing_bucket_settings,
    check_storage_needs_project,
    check_soft_delete_days,
]
