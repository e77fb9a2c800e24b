"""Pre-deploy checks on the typed model: one named function per rule, each returning its problems.

Each problem starts with the key path as `pulumi config set --path` spells it. The schema already
guaranteed types and ranges; these are the rules that need the catalog or several keys at once.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

from checks.common import PROJECT_DIR, Check, at, is_file, or_list
from model import catalog as gpu_catalog
from model import serving_gateway
from model.pair_rules import PairRule, pair_problems
from model.problems import Problem
from model.suggest import did_you_mean
from model.types import StackConfig

# GKE names: lowercase letter first, then lowercase letters, digits, hyphens; no trailing hyphen.
GKE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CLUSTER_NAME_MAX = 40
# Pulumi appends "-" and 7 random characters to auto-named pools; GKE allows 40 characters in all.
POOL_NAME_MAX = 32
DOCKER_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

def _network(value: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        return None


def check_region_in_catalog(m: StackConfig) -> list[Problem]:
    if m.cluster is None or not m.region:
        return []
    problem = gpu_catalog.load().region_problem(m.region)
    return [Problem("gcp:region", f"{m.region} is {problem}")] if problem else []


def cluster_name_problem(name: str) -> Problem | None:
    """Why GKE would refuse `name` for a cluster, as `cluster.name`'s message (the stack writer's too), or None."""
    if not GKE_NAME.match(name) or len(name) > CLUSTER_NAME_MAX:
        return (Problem("cluster.name", f"{name!r} is not a GKE cluster name (lowercase letters, digits and hyphens, "
                f"starting with a letter, at most {CLUSTER_NAME_MAX} characters)"))
    return None


def check_cluster_name(m: StackConfig) -> list[Problem]:
    if m.cluster is None:
        return []
    problem = cluster_name_problem(m.cluster.name)
    return [problem] if problem else []


def check_cluster_location(m: StackConfig) -> list[Problem]:
    if m.cluster is None or m.cluster.location is None:
        return []
    zones = gpu_catalog.load().regions.get(m.region, ())
    if m.cluster.location != m.region and m.cluster.location not in zones:
        return [Problem("cluster.location",
                        f"{m.cluster.location} is neither gcp:region {m.region} nor one of its zones "
                        f"({', '.join(zones)})")]
    return []


def _named_ranges(m: StackConfig) -> Iterator[tuple[str, str]]:
    yield "network.subnetCidr", m.network.subnet_cidr
    yield "network.podsCidr", m.network.pods_cidr
    yield "network.servicesCidr", m.network.services_cidr
    if m.cluster is not None and m.cluster.private_nodes:
        yield "cluster.masterCidr", m.cluster.master_cidr
    if serving_gateway.servers(m):  # the gateway's proxy-only subnet exists only then
        yield "network.proxyOnlyCidr", m.network.proxy_only_cidr


def check_cidrs(m: StackConfig) -> list[Problem]:
    """Valid IPv4 CIDRs that do not overlap; a /28 for a private control plane."""
    if m.cluster is None:
        return []
    problems, parsed = [], []
    for key, value in _named_ranges(m):
        net = _network(value)
        if net is None:
            problems.append(Problem(key, f"{value!r} is not an IPv4 CIDR with its host bits zero (e.g. 10.10.0.0/20)"))
            continue
        for other_key, other in parsed:
            if net.overlaps(other):
                problems.append(Problem(key, f"{value} overlaps {other_key} ({other})"))
        parsed.append((key, net))
    if m.cluster.private_nodes:
        net = _network(m.cluster.master_cidr)
        if net is not None and net.prefixlen != 28:
            problems.append(Problem("cluster.masterCidr", f"a private control plane needs a /28, got /{net.prefixlen}"))
    for i, an in enumerate(m.cluster.authorized_networks):
        net = _network(an.cidr)
        if net is None:
            problems.append(Problem(at('cluster', 'authorizedNetworks', i, 'cidr'), f"{an.cidr!r} is not an IPv4 CIDR"))
        elif net.prefixlen == 0:
            problems.append(Problem(at('cluster', 'authorizedNetworks', i, 'cidr'), f"{an.cidr} would open the control "
                            "plane to the whole internet; list only your networks"))
    return problems


PRIVATE_ENDPOINT = (PairRule("cluster.privateEndpoint", "a private endpoint needs cluster.privateNodes: true",
                             needs="cluster.privateNodes"),)


def check_private_endpoint(m: StackConfig) -> list[Problem]:
    return pair_problems(m, "", PRIVATE_ENDPOINT)


def check_system_pool(m: StackConfig) -> list[Problem]:
    if m.cluster is None:
        return []
    sp, problems = m.cluster.system_pool, []
    if sp.min_nodes > sp.max_nodes:
        problems.append(Problem("cluster.systemPool.minNodes", f"{sp.min_nodes} is more than maxNodes {sp.max_nodes}"))
    zones = gpu_catalog.load().regions.get(m.region, ())
    for i, zone in enumerate(sp.zones):
        if zones and zone not in zones:
            problems.append(Problem(at('cluster', 'systemPool', 'zones', i), f"{zone} is not a zone of {m.region}"
                            f"{did_you_mean(zone, zones)}"))
    return problems


def check_pools_need_cluster(m: StackConfig) -> list[Problem]:
    if m.node_pools and m.cluster is None:
        return [Problem("nodePools",
                        "GPU node pools need a GKE cluster; set `cluster` (e.g. cluster.name) or remove nodePools")]
    return []


def check_pool_names(m: StackConfig) -> list[Problem]:
    problems, seen = [], set()
    for i, pool in enumerate(m.node_pools):
        key = at("nodePools", i, "name")
        if not GKE_NAME.match(pool.name) or len(pool.name) > POOL_NAME_MAX:
            problems.append(Problem(key,
                                    f"{pool.name!r} is not a valid pool name (lowercase letters, digits and hyphens, "
                                    f"starting with a letter, at most {POOL_NAME_MAX} characters)"))
        if pool.name in seen:
            problems.append(Problem(key, f"{pool.name!r} is used by another pool; pool names must be unique"))
        seen.add(pool.name)
    return problems


def check_pool_sizes(m: StackConfig) -> list[Problem]:
    return [Problem(at('nodePools', i, 'minNodes'), f"{p.min_nodes} is more than maxNodes {p.max_nodes}")
            for i, p in enumerate(m.node_pools) if p.min_nodes > p.max_nodes]


def check_gpu_known(m: StackConfig) -> list[Problem]:
    known = gpu_catalog.load().gpus
    problems = []
    for i, pool in enumerate(m.node_pools):
        if pool.gpu.type not in known:
            problems.append(Problem(at('nodePools', i, 'gpu', 'type'), f"unknown GPU type {pool.gpu.type!r}; "
                            f"known: {', '.join(known)}{did_you_mean(pool.gpu.type, known)}"))
    return problems


def _article(word: str) -> str:
    # Letters whose spoken names start with a vowel sound: "an n1", "an a2", "a g2".
    return "an" if word[:1] in "aefhilmnorsx" else "a"


def machine_problems(prefix: list, gpu_type: str, machine_type: str, count: int) -> list[Problem]:
    """The machine family must carry the GPU, and the machine shape must take that many GPUs. Suggestions are
    only shapes that take `count` of the GPU, smallest first. `prefix` is the key path of the object holding
    `machineType` and `gpu` (a pool, or `vertex`)."""
    cat = gpu_catalog.load()
    gpu = cat.gpus.get(gpu_type)
    if gpu is None or cat.shape(gpu_type, machine_type, count):
        return []
    fitting = cat.machine_types(gpu_type, count)
    takes = f"{count} {gpu_type}"
    hint = (f"{gpu.family} types that take {takes}: {', '.join(fitting[:4])}" if fitting else
            f"no {gpu.family} type takes {takes}; they take {or_list(sorted({s.gpus for s in gpu.shapes}))}")
    counts = cat.counts(gpu_type, machine_type)
    if counts:
        use = f"; for {count} use {or_list(fitting[:4])}" if fitting else ""
        return [Problem(at(*prefix, 'gpu', 'count'),
                        f"{machine_type} takes {or_list(counts)} {gpu_type}, got {count}{use}")]
    if machine_type.startswith(f"{gpu.family}-") and not cat.knows_machine_type(machine_type):
        return [Problem(at(*prefix, 'machineType'),
                        f"{machine_type} is not a machine type data/gpu_catalog.yaml knows; "
                        f"check its name ({hint})")]
    family = f"{_article(gpu.family)} {gpu.family}"
    return [Problem(at(*prefix, 'machineType'), f"{gpu_type} needs {family} machine type, got {machine_type} ({hint})")]


def check_machine_fits_gpu(m: StackConfig) -> list[Problem]:
    return [problem for i, pool in enumerate(m.node_pools)
            for problem in machine_problems(["nodePools", i], pool.gpu.type, pool.machine_type, pool.gpu.count)]


def _typo(zone: str, region: str, offered: tuple[str, ...]) -> str:
    """'Did you mean' for a zone the region does not have at all (a typo), not for a real zone without the GPU."""
    return "" if zone in gpu_catalog.load().regions.get(region, ()) else did_you_mean(zone, offered)


def check_gpu_zones(m: StackConfig) -> list[Problem]:
    """Each pool's zones must offer its GPU; with no zones given, the region must offer it somewhere."""
    cat, problems = gpu_catalog.load(), []
    for i, pool in enumerate(m.node_pools):
        if pool.gpu.type not in cat.gpus or m.region not in cat.regions:
            continue
        offered, unconfirmed = cat.zones(pool.gpu.type, m.region), cat.unconfirmed_zones(pool.gpu.type, m.region)
        if not offered and not unconfirmed:
            problems.append(Problem(at('nodePools', i, 'gpu', 'type'), f"{pool.gpu.type} is not offered in {m.region}"))
            continue
        if not offered and not pool.zones:
            problems.append(Problem(at('nodePools', i, 'gpu', 'type'),
                                    f"{pool.gpu.type} is offered in {m.region} only in "
                            f"zones data/gpu_catalog.yaml has unconfirmed ({', '.join(unconfirmed)}); name one in "
                            f"{at('nodePools', i, 'zones')} to try it"))
            continue
        for j, zone in enumerate(pool.zones):
            if zone not in offered and zone not in unconfirmed:
                known = ", ".join([*offered, *(f"{z} (unconfirmed)" for z in unconfirmed)])
                problems.append(Problem(at('nodePools', i, 'zones', j), f"{zone} does not offer {pool.gpu.type} "
                                f"(zones of {m.region} that do: {known}){_typo(zone, m.region, offered)}"))
    return problems


def existing_network_warnings(m: StackConfig) -> list[Problem]:
    """What the stack no longer creates on an existing VPC, where something it runs needs it."""
    if m.network.existing is None or m.cluster is None:
        return []
    found = []
    if m.cluster.private_nodes:
        found.append(Problem("network.existing", "private nodes pull images and models through Cloud NAT, which the "
                             "stack does not create on an existing VPC: the network's owner must provide it (a Cloud "
                             "Router with NAT in the subnet's region)"))
    if serving_gateway.servers(m):
        found.append(Problem("network.existing", f"{', '.join(serving_gateway.servers(m))}'s Inference Gateway needs "
                             "an ACTIVE REGIONAL_MANAGED_PROXY (proxy-only) subnet in the subnet's region of that VPC, "
                             "which the stack does not create there; its range is what the servers' NetworkPolicy "
                             "admits (set network.proxyOnlyCidr to it)"))
    return found


def warnings(m: StackConfig) -> list[Problem]:
    """A pool zone that only one view of the catalog's zone source lists: it may not offer the GPU."""
    cat, found = gpu_catalog.load(), existing_network_warnings(m)
    for i, pool in enumerate(m.node_pools):
        for j, zone in enumerate(pool.zones):
            if zone in cat.unconfirmed_zones(pool.gpu.type, m.region):
                found.append(Problem(at('nodePools', i, 'zones', j),
                                     f"data/gpu_catalog.yaml has {zone} for {pool.gpu.type} unconfirmed (one view of "
                                     "its zone source lists it, another does not); check `gcloud compute "
                                     f"accelerator-types list --filter=zone:{zone}` before relying on it"))
    return found


def check_registry_name(m: StackConfig) -> list[Problem]:
    name = m.registry.name
    if not re.match(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", name):
        return [Problem("registry.name", f"{name!r} is not an Artifact Registry repository id "
                "(lowercase letters, digits and hyphens, starting with a letter)")]
    return []


def check_image(m: StackConfig) -> list[Problem]:
    img, problems = m.image, []
    if not re.match(r"^[a-z0-9]+([._/-][a-z0-9]+)*$", img.name):
        problems.append(Problem("image.name", f"{img.name!r} is not a valid image name (lowercase, digits, . _ - /)"))
    if not DOCKER_TAG.match(img.tag):
        problems.append(Problem("image.tag", f"{img.tag!r} is not a valid Docker tag"))
    if img.prebuilt is None:
        if not is_file(PROJECT_DIR / img.context / "Dockerfile"):
            problems.append(Problem("image.context", f"no Dockerfile at {img.context}/Dockerfile "
                            "(set image.context to a folder with one, or image.prebuilt to an existing image)"))
    elif ":" not in img.prebuilt and "@" not in img.prebuilt:
        problems.append(Problem("image.prebuilt", f"{img.prebuilt!r} has neither a tag nor a digest; pin it"))
    return problems


_PATH = re.compile(r"^projects/(?P<project>[^/]+)/(regions/(?P<region>[^/]+)/subnetworks|global/networks)/[^/]+$")


def check_existing_network(m: StackConfig) -> list[Problem]:
    """`network.existing`: for the stack's own cluster, its subnet in the stack's region and the network's project
    (a Shared VPC's subnets are its host project's)."""
    e = m.network.existing
    if e is None:
        return []
    if m.cluster is None:
        return [Problem("network.existing", "is the network of the cluster the stack creates, and this stack creates "
                        "none (no `cluster`); remove it")]
    net, sub = _PATH.match(e.network), _PATH.match(e.subnetwork)
    if net is None or sub is None:
        return []  # the schema says what form each takes
    problems = []
    if sub["project"] != net["project"]:
        problems.append(Problem("network.existing.subnetwork", f"is in project {sub['project']}, its network in "
                                f"{net['project']}; a subnet belongs to its VPC's (host) project: "
                                f"projects/{net['project']}/regions/{m.region}/subnetworks/NAME"))
    if sub["region"] != m.region:
        problems.append(Problem("network.existing.subnetwork", f"is in region {sub['region']}, the stack in "
                                f"{m.region} (gcp:region); a regional cluster's nodes need a subnet of its region: "
                                f"projects/{sub['project']}/regions/{m.region}/subnetworks/NAME"))
    return problems


CHECKS: list[Check] = [
    check_region_in_catalog,
    check_existing_network,
    check_cluster_name,
    check_cluster_location,
    check_cidrs,
    check_private_endpoint,
    check_system_pool,
    check_pools_need_cluster,
    check_pool_names,
    check_pool_sizes,
    check_gpu_known,
    check_machine_fits_gpu,
    check_gpu_zones,
    check_registry_name,
    check_image,
]

