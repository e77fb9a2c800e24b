"""kind tensorboard: a TensorBoard server of the event files the stack's finetune workloads write to the bucket.

Config: TensorboardWorkloadConfig (model/workload_serving.py; its keys: kind, namespace, image, gcsFuse and
`tensorboard`: which finetune workloads, the port, the server's CPU and memory, how often it reads again). Builder:
the TensorBoardServer component (workloads/tensorboard.py): one pod on the system pool over a read-only GCS FUSE
mount of the bucket, a ClusterIP Service, a NetworkPolicy. Summary (`workloads.<name>`): the runs it shows, where
it reads them, the port-forward command and the URL to open (the preview's "Training" section prints them).

Rules: every name in `tensorboard.workloads` is a finetune workload of this stack that writes to the bucket; with
none named, at least one does; the mount path can be written in --logdir_spec; the server and the GCS FUSE sidecar
fit a system pool node. The bucket and the cluster themselves: checks/vertex.py's rule for every bucket reader
(`gcsFuse.enabled` is always true here).
"""

from __future__ import annotations

import pulumi

from model import catalog as gpu_catalog
from model import node_memory
from model.problems import Problem
from model.suggest import did_you_mean
from model.types import FinetuneWorkloadConfig, StackConfig, TensorboardWorkloadConfig
from model.validators import at
from workloads.kinds.kind import Built, Kind, Platform
from workloads.tensorboard import TensorBoardArgs, TensorBoardServer, facts


def _key(w: TensorboardWorkloadConfig, *path: str | int) -> str:
    return at("workloads", w.name, *path)


def _finetunes(m: StackConfig) -> list[FinetuneWorkloadConfig]:
    return [t for _, t in sorted(m.workloads.items()) if isinstance(t, FinetuneWorkloadConfig)]


def _known(m: StackConfig) -> str:
    names = [t.name for t in _finetunes(m)]
    return f"the stack's finetune workloads: {', '.join(names)}" if names else "the stack has no finetune workload"


def check_named_workloads(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """Each name is a finetune workload (finetune.py writes the event files: TENSORBOARD_LOGGING_DIR) whose run
    writes them to the bucket (`gcsFuse.enabled`; else they go to its claim, which the server does not mount)."""
    problems = []
    for i, name in enumerate(w.tensorboard.workloads):
        key, target = _key(w, "tensorboard", "workloads", i), m.workloads.get(name)
        if target is None:
            problems.append(Problem(key, f"no workload is named {name!r}"
                            f"{did_you_mean(name, [t.name for t in _finetunes(m)])} ({_known(m)})"))
        elif not isinstance(target, FinetuneWorkloadConfig):
            problems.append(Problem(key,
                                    f"{name} is a {target.kind} workload; only finetune workloads write TensorBoard "
                                    f"event files (finetune.py, to logs/<workload>/ of the bucket) ({_known(m)})"))
        elif not target.gcs_fuse.enabled:
            problems.append(Problem(key,
                                    f"{name} writes its event files to its claim ({target.storage.mount_path}/logs/"
                                    f"{name}), not to the bucket this server reads; set "
                                    f"{at('workloads', name, 'gcsFuse', 'enabled')}: true"))
    return problems


def check_something_to_show(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """With no names, every finetune workload that writes to the bucket: there must be one."""
    if w.tensorboard.workloads or any(t.gcs_fuse.enabled for t in _finetunes(m)):
        return []
    why = ("none of them writes to the bucket (gcsFuse.enabled)" if _finetunes(m) else
           "the stack has no finetune workload")
    return [Problem(_key(w, 'tensorboard', 'workloads'),
                    f"empty, which shows every finetune workload that writes its event "
            f"files to the bucket, but {why}; add a finetune workload with gcsFuse.enabled: true, or remove {w.name}")]


def warn_not_shown(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """With no names, a finetune workload that writes to its claim is left out: say so."""
    if w.tensorboard.workloads:
        return []
    return [Problem(_key(w, 'tensorboard', 'workloads'),
                    f"{t.name} is not shown: it writes its event files to its claim, "
                    f"not the bucket (set {at('workloads', t.name, 'gcsFuse', 'enabled')}: true to show it)")
            for t in _finetunes(m) if not t.gcs_fuse.enabled]


def check_reads_the_bucket(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """The server has nothing to show without the bucket's mount (the key exists for its mountPath)."""
    if w.gcs_fuse.enabled:
        return []
    return [Problem(_key(w, 'gcsFuse', 'enabled'),
                    "false, but a TensorBoard server reads the runs' event files from the "
            "stack's bucket through its GCS FUSE mount; remove the key (it is always true for kind tensorboard)")]


def check_mount_path(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """--logdir_spec separates runs with commas and names them with colons: a path holding one is read as two."""
    path = w.gcs_fuse.mount_path
    bad = [c for c in facts()["server"]["specSeparators"] if c in path]
    if not bad:
        return []
    return [Problem(_key(w, 'gcsFuse', 'mountPath'), f"{path!r} holds {' and '.join(repr(c) for c in bad)}, which "
            "TensorBoard's --logdir_spec reads as separators (NAME:PATH,NAME:PATH); choose a path without them, "
            "e.g. /gcs")]


def check_fits_system_pool(m: StackConfig, w: TensorboardWorkloadConfig) -> list[Problem]:
    """The server's request (= limit) and the GCS FUSE sidecar's fit a system pool node's allocatable (model/
    node_memory.py), the system pods (kube-dns, the MPI operator) not counted. An unknown machine is not judged."""
    machine = gpu_catalog.load().general_machines.get(m.cluster.system_pool.machine_type) if m.cluster else None
    if machine is None:
        return []
    node = node_memory.allocatable(machine.vcpus, machine.memory_gb)
    sidecar = node_memory.pod_sidecars(gcs_fuse=True)
    tb, problems = w.tensorboard, []
    room_cpu, room_gib = node.cpu_allocatable - sidecar.cpu, node.memory_allocatable_gib - sidecar.memory_gib
    cpu, memory = node_memory.quantity_bytes(tb.cpu), node_memory.quantity_bytes(tb.memory)
    where = f"a {machine.machine_type} node of the system pool (cluster.systemPool.machineType)"
    if cpu is not None and cpu > room_cpu:
        problems.append(Problem(_key(w, 'tensorboard', 'cpu'), f"{tb.cpu} is more than {where} has for it: "
                        f"{node.cpu_allocatable:.2f} allocatable less the GCS FUSE sidecar's {sidecar.cpu:g} = "
                        f"{room_cpu:.2f}; ask less (the default is 500m)"))
    if memory is not None and memory / node_memory.GIB_BYTES > room_gib:
        problems.append(Problem(_key(w, 'tensorboard', 'memory'), f"{tb.memory} is more than {where} has for it: "
                        f"{node.memory_allocatable_gib:.2f} GiB allocatable less the GCS FUSE sidecar's "
                        f"{sidecar.memory_gib:g} GiB = {room_gib:.2f} GiB; ask less (the default is 2Gi), or a "
                        "larger system pool machine"))
    return problems


def build(name: str, w: TensorboardWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    # The rules before it guarantee the bucket (storage.enabled) and the cluster, hence the stack's image.
    assert platform.bucket is not None and (w.image or platform.image is not None)
    server = TensorBoardServer(name, TensorBoardArgs(
        cfg=platform.cfg, workload=w, image_ref=w.image or platform.image, bucket=platform.bucket), opts)
    return Built(server, server.summary)


KIND: Kind[TensorboardWorkloadConfig] = Kind(
    name="tensorboard",
    config=TensorboardWorkloadConfig,
    rules=(check_reads_the_bucket, check_named_workloads, check_something_to_show, check_mount_path,
           check_fits_system_pool),
    build=build,
    warnings=(warn_not_shown,),
)
