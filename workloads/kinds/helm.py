"""kind helm: the Bitnami DeepSpeed chart (a client and SSH workers) on one GKE GPU pool.

Config: HelmWorkloadConfig (model/workload_training.py; its keys: the common ones, `chart`, `launch`, `deepspeed`).
Builder: the DeepSpeedRelease component (workloads/deepspeed_release.py). Summary: the release, its status, chart,
pool, workers and GPUs per worker (`workloads.<name>`).
"""

from __future__ import annotations

import pulumi

from model.problems import Problem
from model.types import HelmWorkloadConfig, StackConfig
from model.validators import at
from workloads.deepspeed_release import DeepSpeedRelease, DeepSpeedReleaseArgs, client_label
from workloads.kinds.kind import Built, Kind, Platform
from workloads.kinds.shared import (
    deepspeed_config_flag,
    launch_script_problems,
    script_flag_problems,
    warn_learning_rate_unused,
)
from workloads.placement import placement

# Helm refuses longer release names (they end up in object names with suffixes such as "-worker-0").
HELM_RELEASE_MAX = 53
# A label key's name part: at most 63 characters (Kubernetes' "Labels and Selectors": a qualified name).
LABEL_NAME_MAX = 63


def check_helm_accelerator(m: StackConfig, w: HelmWorkloadConfig) -> list[Problem]:
    if w.on_nvidia:
        return []
    return [Problem(at('workloads', w.name, 'accelerator', 'kind'), f"kind helm runs on NVIDIA GKE pools only, got "
            f"{w.accelerator.kind}; use kind mpijob for Gaudi")]


def check_launch_script(m: StackConfig, w: HelmWorkloadConfig) -> list[Problem]:
    """The client runs `launch.script` from recipes, shipped in the source ConfigMap."""
    return launch_script_problems(w)


def check_launch_args(m: StackConfig, w: HelmWorkloadConfig) -> list[Problem]:
    """The client's command line is the script with --deepspeed_config and `launch.args` (workloads/
    deepspeed_release.py): flags the script's parser has, else every rank stops at start-up."""
    return script_flag_problems(w, deepspeed_config_flag(m, w))


def warn_helm_learning_rate(m: StackConfig, w: HelmWorkloadConfig) -> list[Problem]:
    return warn_learning_rate_unused(w)


def check_client_label(m: StackConfig, w: HelmWorkloadConfig) -> list[Problem]:
    """The workers' NetworkPolicy admits the client by the label `<fullname>-client`, which must be a valid key."""
    if len(w.name) > HELM_RELEASE_MAX:  # too long a release name is its own problem
        return []
    key = client_label(w.name)
    if len(key) <= LABEL_NAME_MAX:
        return []
    room = LABEL_NAME_MAX - len("-deepspeed-client")
    return [Problem(at('workloads', w.name), f"the chart's client pod label {key!r} is {len(key)} characters, over "
            f"Kubernetes' {LABEL_NAME_MAX} for a label key; use a name of at most {room} characters, or one that "
            "contains 'deepspeed' (then the chart does not append it)")]


def build(name: str, w: HelmWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    release = DeepSpeedRelease(name, DeepSpeedReleaseArgs(
        workload=w, placement=placement(platform.cfg, w), image_ref=platform.image, hf_token=platform.hf_token,
        bucket=platform.bucket), opts)
    return Built(release, release.summary)


KIND: Kind[HelmWorkloadConfig] = Kind(
    name="helm",
    config=HelmWorkloadConfig,
    rules=(check_helm_accelerator, check_launch_script, check_launch_args, check_client_label),
    build=build,
    warnings=(warn_helm_learning_rate,),
    max_name=HELM_RELEASE_MAX,
)
