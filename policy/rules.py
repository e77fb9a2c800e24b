"""The deepspeed-stack policies: GKE hardening and workload hygiene, as CrossGuard resource validations.

This module is the pack's table (`POLICIES`, which __main__.py hands to `PolicyPack`); the rules live beside it by
area: `rules_gke.py`, `rules_workloads.py`, `rules_vpc.py`, and what they all read in `rules_support.py`. The pack
imports nothing from the project (Pulumi runs the pack in its own virtualenv with only `requirements.txt`), so the
offline preview and the tests import the very same functions (`policy.rules`) and call them with
`ResourceValidationArgs` built from its records.
"""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationPolicy

from policy.rules_gke import (
    authorized_networks_not_open,
    auto_repair_upgrade,
    cos_containerd,
    deletion_protection_on_prod,
    no_client_certificate,
    no_legacy_abac,
    node_service_account,
    private_nodes,
    release_channel,
    shielded_nodes,
    workload_identity,
)
from policy.rules_support import STACK_CONFIG, Validate
from policy.rules_vpc import firewall_ingress_not_open, intranode_visibility, subnet_flow_logs_on_prod
from policy.rules_workloads import (
    accelerator_pods_set_resources,
    habana_images_by_digest,
    helm_chart_version_pinned,
    images_pinned,
    no_plaintext_secret_env,
)


def _policy(name: str, description: str, validate: Validate,
            level: EnforcementLevel = EnforcementLevel.MANDATORY) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(name=name, description=description, validate=validate, enforcement_level=level,
                                    config_schema=STACK_CONFIG)


POLICIES: list[ResourceValidationPolicy] = [
    _policy("gke-private-nodes", "GKE nodes have private IPs on every stack but dev.", private_nodes),
    _policy("gke-authorized-networks-not-open", "The control plane is not open to 0.0.0.0/0 or ::/0.",
            authorized_networks_not_open),
    _policy("gke-workload-identity", "Workload Identity is on (cluster pool, GKE_METADATA on nodes).",
            workload_identity),
    _policy("gke-shielded-nodes", "Shielded nodes with secure boot and integrity monitoring on every pool.",
            shielded_nodes),
    _policy("gke-node-service-account", "Nodes do not run as the Compute Engine default service account.",
            node_service_account),
    _policy("gke-release-channel", "The cluster follows a release channel.", release_channel),
    _policy("gke-node-auto-repair-upgrade", "Node pools auto-repair and auto-upgrade.", auto_repair_upgrade),
    _policy("gke-cos-containerd", "Nodes run Container-Optimized OS with containerd.", cos_containerd),
    _policy("gke-no-legacy-abac", "Legacy ABAC is off.", no_legacy_abac),
    _policy("gke-no-client-certificate", "No client certificate is issued.", no_client_certificate),
    _policy("gke-deletion-protection-on-prod", "Production clusters have deletion protection.",
            deletion_protection_on_prod),
    _policy("no-plaintext-secret-env", "No credential is set as a literal env value.", no_plaintext_secret_env),
    _policy("accelerator-pods-set-resources", "GPU and Gaudi containers request and limit CPU and memory.",
            accelerator_pods_set_resources),
    _policy("images-pinned", "Container images are pinned by digest or fixed tag outside dev.", images_pinned),
    _policy("habana-images-by-digest", "Habana images (versioned path, `latest` tag) are pinned by digest.",
            habana_images_by_digest, EnforcementLevel.ADVISORY),
    _policy("helm-chart-version-pinned", "Helm charts are pinned to an exact version.", helm_chart_version_pinned),
    _policy("gke-intranode-visibility", "Intranode visibility is on.", intranode_visibility),
    _policy("gcp-subnet-flow-logs-on-prod", "Production subnets log a sample of their flows.",
            subnet_flow_logs_on_prod),
    _policy("gcp-firewall-ingress-not-open", "No ingress allow rule is open to 0.0.0.0/0 or ::/0.",
            firewall_ingress_not_open),
]
