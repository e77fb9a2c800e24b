"""The deepspeed-stack policies: GKE hardening and workload hygiene, as CrossGuard resource validations.

This module is the whole pack's logic. It imports nothing from the project (Pulumi runs the pack in its
own virtualenv with only `requirements.txt`), so the offline preview and the tests import the very
same functions (`policy.rules`) and call them with `ResourceValidationArgs` built from its records.

Properties arrive camelCase, as the engine sees them. Values the program marked secret arrive as plain
values under `pulumi preview`, and as the string "[secret]" from the offline preview.

Which stack is this? Some rules depend on it (private nodes on every stack but dev, deletion
protection on prod, pinned images outside dev). `stack_name()` takes it from, in order: the policy's
config key `stack`, the environment variable `DEEPSPEED_POLICY_STACK`, the resource URN
(`urn:pulumi:<stack>::...`, always present) and `pulumi.get_stack()`. The config keys `devStacks`
(default ["dev"]) and `prodStacks` (default ["prod"]) say which stacks are dev and prod.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
HELM_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart", "kubernetes:helm.sh/v3:Chart")
STACK_ENV = "DEEPSPEED_POLICY_STACK"
DEFAULT_DEV_STACKS = ("dev",)
DEFAULT_PROD_STACKS = ("prod",)
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
ACCELERATORS = ("nvidia.com/gpu", "habana.ai/gaudi")
SECRET = "[secret]"
UNKNOWN = "[unknown]"  # a value only known after `pulumi up` (an output), as `plain()` shows it
# Env var names that carry credentials: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, DB_PASSWORD, API_KEY, AWS_SECRET_...
SECRET_ENV_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|APIKEY|CREDENTIALS?)(_|$)", re.I)
# ...except a variable that names where the secret is: HF_TOKEN_PATH (huggingface_hub's own variable, read as a
# file path), GOOGLE_APPLICATION_CREDENTIALS_FILE, *_DIR. Its value is a path, not the secret, so it passes only
# when the value is an absolute path; HF_TOKEN_PATH=hf_abc... is still a literal secret.
SECRET_PATH_ENV_NAME = re.compile(r"_(PATH|FILE|DIR)$", re.I)
ABSOLUTE_PATH = re.compile(r"^/[^\s]*$")
# Keys under which pod specs (env) and Bitnami-style Helm values (extraEnvVars) list env entries.
ENV_KEYS = ("env", "extraEnvVars", "extraEnv")
EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
DEFAULT_COMPUTE_SA = re.compile(r"-compute@developer\.gserviceaccount\.com$")
# Habana publishes one `latest` tag per versioned path, e.g.
# vault.habana.ai/gaudi-docker/1.19.1/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:latest
HABANA_VERSIONED = re.compile(r"^vault\.habana\.ai/gaudi-docker/\d+\.\d+\.\d+/[^:@]+:latest$")

STACK_CONFIG = PolicyConfigSchema(properties={
    "stack": {"type": "string", "description": "The stack name; default: from the resource URN."},
    "devStacks": {"type": "array", "items": {"type": "string"}, "default": list(DEFAULT_DEV_STACKS),
                  "description": "Stacks treated as dev (public nodes, unpinned images allowed)."},
    "prodStacks": {"type": "array", "items": {"type": "string"}, "default": list(DEFAULT_PROD_STACKS),
                   "description": "Stacks treated as production (deletion protection required)."},
})


# --- helpers -------------------------------------------------------------------------------------

def stack_name(args: ResourceValidationArgs) -> str:
    config = args.get_config() or {}
    if config.get("stack"):
        return str(config["stack"])
    if os.environ.get(STACK_ENV):
        return os.environ[STACK_ENV]
    if args.urn and args.urn.startswith("urn:pulumi:"):
        return args.urn.split("::", 1)[0][len("urn:pulumi:"):]
    import pulumi  # only in a real run is the engine's stack known here

    return pulumi.get_stack()


def is_dev(args: ResourceValidationArgs) -> bool:
    return stack_name(args) in (args.get_config() or {}).get("devStacks", DEFAULT_DEV_STACKS)


def is_prod(args: ResourceValidationArgs) -> bool:
    return stack_name(args) in (args.get_config() or {}).get("prodStacks", DEFAULT_PROD_STACKS)


def plain(value: Any) -> Any:
    """Plain dicts and lists from the analyzer's proxies, with values unknown during preview (outputs of
    resources not created yet) as UNKNOWN instead of an exception on access, so one unknown digest does
    not stop the whole policy."""
    if isinstance(value, Mapping):
        out = {}
        for key in value:
            try:
                out[key] = plain(value[key])
            except UnknownValueError:
                out[key] = UNKNOWN
        return out
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = []
        for i in range(len(value)):
            try:
                items.append(plain(value[i]))
            except UnknownValueError:
                items.append(UNKNOWN)
        return items
    return value


def props_of(args: ResourceValidationArgs) -> dict[str, Any]:
    # The offline preview passes plain dicts (nothing unknown, nothing to unwrap): no copy needed.
    return args.props if type(args.props) is dict else plain(args.props)


def get(props: Mapping[str, Any] | None, path: str, default: Any = None) -> Any:
    """`get(props, "nodeConfig.shieldedInstanceConfig.enableSecureBoot")`, None-safe."""
    node: Any = props
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every object inside `value` with its dotted path (lists as [i])."""
    if isinstance(value, Mapping):
        yield path, value
        for key, item in value.items():
            yield from walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from walk(item, f"{path}[{i}]")


def is_kubernetes(args: ResourceValidationArgs) -> bool:
    return args.resource_type.startswith("kubernetes:")


def node_configs(args: ResourceValidationArgs, props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, nodeConfig) of every pool this resource creates: a NodePool's own, a cluster's inline
    `nodePools[]`, and the cluster's default pool unless `removeDefaultNodePool` deletes it."""
    if args.resource_type == NODE_POOL:
        yield "nodeConfig", props.get("nodeConfig") or {}
    elif args.resource_type == CLUSTER:
        if not props.get("removeDefaultNodePool") and not props.get("enableAutopilot"):
            yield "nodeConfig", props.get("nodeConfig") or {}
        for i, pool in enumerate(props.get("nodePools") or []):
            yield f"nodePools[{i}].nodeConfig", pool.get("nodeConfig") or {}


def hardened_node_configs(args: ResourceValidationArgs,
                          props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """node_configs, plus a cluster's default pool even when `removeDefaultNodePool` deletes it: GKE creates it
    first, so an organization policy requiring Shielded VMs blocks the cluster if it is not hardened too."""
    yield from node_configs(args, props)
    if args.resource_type == CLUSTER and props.get("removeDefaultNodePool") and not props.get("enableAutopilot"):
        yield "nodeConfig", props.get("nodeConfig") or {}


Validate = Callable[[ResourceValidationArgs, ReportViolation], None]


# --- GKE -----------------------------------------------------------------------------------------

def private_nodes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER or is_dev(args):
        return
    if get(props, "privateClusterConfig.enablePrivateNodes") is not True:
        report(f"privateClusterConfig.enablePrivateNodes must be true on stack {stack_name(args)!r} "
               "(only dev stacks may have nodes with public IPs); set cluster.privateNodes: true")


def authorized_networks_not_open(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER:
        return
    for i, block in enumerate(get(props, "masterAuthorizedNetworksConfig.cidrBlocks") or []):
        cidr = str(block.get("cidrBlock", ""))
        try:
            open_to_all = ipaddress.ip_network(cidr, strict=False).prefixlen == 0
        except ValueError:
            continue
        if open_to_all:
            report(f"masterAuthorizedNetworksConfig.cidrBlocks[{i}].cidrBlock is {cidr}: the control plane would "
                   "be open to the whole internet; list only your networks")


def workload_identity(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER:
        pool = get(props, "workloadIdentityConfig.workloadPool")
        if not pool or not str(pool).endswith(".svc.id.goog"):
            report(f"workloadIdentityConfig.workloadPool must be PROJECT.svc.id.goog, got {pool!r}")
    for path, node in hardened_node_configs(args, props):
        mode = get(node, "workloadMetadataConfig.mode")
        if mode not in (None, "GKE_METADATA"):
            report(f"{path}.workloadMetadataConfig.mode is {mode}: pods would see the node's credentials; "
                   "use GKE_METADATA")


def shielded_nodes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and props.get("enableShieldedNodes") is False:
        report("enableShieldedNodes is false")
    for path, node in hardened_node_configs(args, props):
        shielded = node.get("shieldedInstanceConfig") or {}
        for key in ("enableSecureBoot", "enableIntegrityMonitoring"):
            if shielded.get(key) is not True:
                report(f"{path}.shieldedInstanceConfig.{key} must be true")


def node_service_account(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    # The default pool's account matters even when the pool is removed right after creation.
    configs = list(node_configs(args, props))
    if args.resource_type == CLUSTER and props.get("removeDefaultNodePool"):
        configs.append(("nodeConfig", props.get("nodeConfig") or {}))
    for path, node in configs:
        account = node.get("serviceAccount")
        if not account or account == "default" or DEFAULT_COMPUTE_SA.search(str(account)):
            report(f"{path}.serviceAccount is {account or 'unset (the Compute Engine default account)'}: "
                   "nodes must run as a dedicated least-privilege service account")


def release_channel(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER:
        return
    channel = get(props, "releaseChannel.channel")
    if channel not in RELEASE_CHANNELS:
        report(f"releaseChannel.channel is {channel or 'unset'}; use one of {', '.join(RELEASE_CHANNELS)}")


def auto_repair_upgrade(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != NODE_POOL:
        return
    # GKE requires auto-repair off on Dynamic Workload Scheduler pools (flex-start, queued provisioning):
    # the waiver is GKE's own rule (cloud.google.com/kubernetes-engine/docs/concepts/dws; data/capacity.yaml).
    dws = get(props, "nodeConfig.flexStart") is True or get(props, "queuedProvisioning.enabled") is True
    for key in ("autoUpgrade",) if dws else ("autoRepair", "autoUpgrade"):
        if get(props, f"management.{key}") is not True:
            report(f"management.{key} must be true")
    if dws and get(props, "management.autoRepair") is not False:
        report("management.autoRepair must be false on a flex-start or queued-provisioning pool (GKE refuses it)")


def cos_containerd(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    for path, node in node_configs(args, props):
        image = node.get("imageType")
        if str(image or "").upper() != "COS_CONTAINERD":
            report(f"{path}.imageType is {image or 'unset'}; use COS_CONTAINERD")


def no_legacy_abac(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and props.get("enableLegacyAbac") is True:
        report("enableLegacyAbac is true; authorize with RBAC only")


def no_client_certificate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and get(
            props, "masterAuth.clientCertificateConfig.issueClientCertificate") is True:
        report("masterAuth.clientCertificateConfig.issueClientCertificate is true; a client certificate "
               "is a credential that cannot be revoked")


def deletion_protection_on_prod(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    # Unset means the provider's default, true.
    if args.resource_type == CLUSTER and is_prod(args) and props.get("deletionProtection") is False:
        report(f"deletionProtection is false on stack {stack_name(args)!r}; set cluster.deletionProtection: true")


# --- workloads -----------------------------------------------------------------------------------

def no_plaintext_secret_env(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Env entries named like credentials must come from a Secret (valueFrom / secretKeyRef), never a
    literal `value`: a value in a pod spec or in Helm values is readable by anyone who can read the
    object (and a Pulumi secret inlined there is plain text in the cluster)."""
    props = props_of(args)
    if not is_kubernetes(args) or args.resource_type == "kubernetes:core/v1:Secret":
        return
    for path, node in walk(props):
        for key in ENV_KEYS:
            entries = node.get(key)
            if not isinstance(entries, list):
                continue
            for i, entry in enumerate(entries):
                if not isinstance(entry, Mapping) or not SECRET_ENV_NAME.search(str(entry.get("name", ""))):
                    continue
                if entry.get("value") not in (None, "") and not names_a_secret_file(entry):
                    where = f"{path}.{key}[{i}]" if path else f"{key}[{i}]"
                    report(f"{where} sets {entry['name']} to a literal value; use valueFrom.secretKeyRef "
                           "(a Kubernetes Secret) instead")


def names_a_secret_file(entry: Mapping[str, Any]) -> bool:
    """HF_TOKEN_PATH=/etc/huggingface/token: a path to a mounted secret, which tells nobody the secret."""
    return bool(SECRET_PATH_ENV_NAME.search(str(entry.get("name", ""))) and ABSOLUTE_PATH.match(str(entry["value"])))


def accelerator_pods_set_resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A container that asks for GPUs or Gaudi cards also requests and limits CPU and memory, so the
    scheduler packs it correctly and a runaway process cannot starve the node's daemons."""
    props = props_of(args)
    if not is_kubernetes(args):
        return
    for path, node in walk(props):
        resources = node.get("resources")
        if not isinstance(resources, Mapping):
            continue
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if not any(a in requests or a in limits for a in ACCELERATORS):
            continue
        where = f"{path}.resources" if path else "resources"
        missing = [f"{part}.{res}" for part, values in (("requests", requests), ("limits", limits))
                   for res in ("cpu", "memory") if res not in values]
        if missing:
            report(f"{where} requests accelerators but has no {', '.join(missing)}")


def image_refs(props: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, reference) of every container image: `image: "ref"` in pod specs, and Bitnami-style
    `image: {registry, repository, tag, digest}` in Helm values."""
    for path, node in walk(props):
        image = node.get("image")
        where = f"{path}.image" if path else "image"
        if isinstance(image, str):
            yield where, image
        elif isinstance(image, Mapping) and image.get("repository"):
            ref = "/".join(str(p) for p in (image.get("registry"), image["repository"]) if p)
            if image.get("tag"):
                ref += f":{image['tag']}"
            if image.get("digest"):
                ref += f"@{image['digest']}"
            yield where, ref


def pinned(ref: str) -> bool:
    """A digest, or a tag that is not `latest`."""
    if DIGEST.search(ref):
        return True
    last = ref.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


def _images(args: ResourceValidationArgs, props: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, reference) of a resource's images: in a Helm release's values, or in the object itself."""
    if args.resource_type in HELM_TYPES:
        for path, ref in image_refs(props.get("values") or {}):
            yield f"values.{path}", ref
    else:
        yield from image_refs(props)


def images_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not is_kubernetes(args) or is_dev(args):
        return
    props = props_of(args)
    if args.resource_type in HELM_TYPES and "bitnamicharts" in str(props.get("chart", "")) and not get(
            props, "values.image.repository"):
        report("values.image is not set: the Bitnami chart's default image moved to docker.io/bitnamilegacy "
               "(Aug 2025) and is not pinned by this stack; set image registry/repository and a digest")
    for path, ref in _images(args, props):
        if SECRET in ref or UNKNOWN in ref or HABANA_VERSIONED.match(ref) or pinned(ref):
            continue  # unknown = the digest of an image built in this update; Habana: see habana_images_by_digest
        report(f"{path} is {ref!r}: pin a digest (@sha256:...) or a fixed tag, never `latest` or no tag")


def habana_images_by_digest(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Habana publishes only a `latest` tag per versioned path (the version is in the path). Accepted,
    but a digest is what makes a rebuild under the same path impossible to pick up by surprise."""
    if not is_kubernetes(args) or is_dev(args):
        return
    for path, ref in _images(args, props_of(args)):
        if HABANA_VERSIONED.match(ref):
            report(f"{path} is {ref!r}: versioned by path only; pin it as ...@sha256:<digest> "
                   "(docker buildx imagetools inspect shows the digest)")


def helm_chart_version_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type not in HELM_TYPES:
        return
    version = str(props.get("version") or "")
    if not EXACT_VERSION.match(version):
        report(f"chart {props.get('chart')!r} has version {version or 'unset'!r}: pin an exact chart version "
               "(e.g. 2.3.51), never a range or the latest")


# --- VPC ------------------------------------------------------------------------------------------

SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"


def intranode_visibility(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Pod-to-pod traffic on one node goes through the VPC, where flow logs and firewall rules see it
    (checkov CKV_GCP_61)."""
    if args.resource_type == CLUSTER and props_of(args).get("enableIntranodeVisibility") is not True:
        report("enableIntranodeVisibility must be true: same-node pod traffic would bypass flow logs and firewalls")


def subnet_flow_logs_on_prod(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Production subnets keep a sample of their flows (checkov CKV_GCP_26)."""
    if args.resource_type == SUBNETWORK and is_prod(args) and not props_of(args).get("logConfig"):
        report(f"logConfig is unset on stack {stack_name(args)!r}: set network.flowLogs.enabled: true")


def firewall_ingress_not_open(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """No ingress rule allows anything from the whole internet (checkov CKV_GCP_2, CKV_GCP_3, CKV_GCP_88 and
    their siblings check this per port)."""
    props = props_of(args)
    if args.resource_type != FIREWALL or str(props.get("direction") or "INGRESS") != "INGRESS":
        return
    if not props.get("allows"):
        return
    for cidr in props.get("sourceRanges") or []:
        try:
            open_to_all = ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
        except ValueError:
            continue
        if open_to_all:
            report(f"sourceRanges has {cidr} on an allow rule: the internet could reach the nodes; list only "
                   "the ranges that need to")


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
