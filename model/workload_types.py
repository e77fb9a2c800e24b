"""The typed workloads: one class per workload kind, each with only its kind's keys (model/schema.yaml's
`workloads` entries: the keys every kind has, plus one branch per kind).

`WORKLOAD_TYPES` maps each kind to its class; the loader (model/types.py `build`) picks the class by the entry's
`kind`. The classes live by kind family: what every kind has in model/workload_base.py, the kinds that train in
model/workload_training.py (their blocks of keys in model/training_blocks.py), the serving ones in
model/workload_serving.py. What a kind does (its rules, its builder, its summary) lives in its module under
workloads/kinds/; these modules hold only what the config says, and the few facts about it that layers below the
kinds ask for (which accelerator, whether it runs as an MPIJob, what it mounts), as properties, so nothing compares
kind names.
"""

from __future__ import annotations

from model.workload_base import WorkloadConfig
from model.workload_serving import ServeWorkloadConfig, TensorboardWorkloadConfig
from model.workload_training import FinetuneWorkloadConfig, HelmWorkloadConfig, MpiJobWorkloadConfig

# The one kind -> class table: a new kind adds its class here (written in the module of its family) and its branch
# in model/schema.yaml.
WORKLOAD_TYPES: dict[str, type[WorkloadConfig]] = {
    "helm": HelmWorkloadConfig,
    "mpijob": MpiJobWorkloadConfig,
    "finetune": FinetuneWorkloadConfig,
    "serve": ServeWorkloadConfig,
    "tensorboard": TensorboardWorkloadConfig,
}
