"""Rules for what the Bitnami DeepSpeed chart derives from a helm workload's name."""

from __future__ import annotations

from checks.common import Check, at
from checks.workloads import HELM_RELEASE_MAX
from model.types import StackConfig
from workloads.deepspeed_release import client_label

# A label key's name part: at most 63 characters (Kubernetes' "Labels and Selectors": a qualified name).
LABEL_NAME_MAX = 63


def check_client_label(m: StackConfig) -> list[str]:
    """The workers' NetworkPolicy admits the client by the label `<fullname>-client`, which must be a valid key."""
    problems = []
    for name, w in m.workloads.items():
        if w.kind != "helm" or len(name) > HELM_RELEASE_MAX:  # too long a release name is its own problem
            continue
        key = client_label(name)
        if len(key) > LABEL_NAME_MAX:
            room = LABEL_NAME_MAX - len("-deepspeed-client")
            problems.append(f"{at('workloads', name)}: the chart's client pod label {key!r} is {len(key)} characters, "
                            f"over Kubernetes' {LABEL_NAME_MAX} for a label key; use a name of at most {room} "
                            "characters, or one that contains 'deepspeed' (then the chart does not append it)")
    return problems


CHECKS: list[Check] = [check_client_label]
