"""What every policy of the pack reads: the resource types, the stack's name and kind, and its properties.

Properties arrive camelCase, as the engine sees them. Values the program marked secret arrive as plain
values under `pulumi preview`, and as the string "[secret]" from the offline preview.

Which stack is this? Some rules depend on it (private nodes on every stack but dev, deletion
protection on prod, pinned images outside dev). `stack_name()` takes it from, in order: the policy's
config key `stack`, the environment variable `DEEPSPEED_POLICY_STACK`, the resource URN
(`urn:pulumi:<stack>::...`, always present) and `pulumi.get_stack()`. The config keys `devStacks`
(default ["dev"]) and `prodStacks` (default ["prod"]) say which stacks are dev and prod.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyConfigSchema, ReportViolation, ResourceValidationArgs
from pulumi_policy.proxy import UnknownValueError

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
STACK_ENV = "DEEPSPEED_POLICY_STACK"
DEFAULT_DEV_STACKS = ("dev",)
DEFAULT_PROD_STACKS = ("prod",)
UNKNOWN = "[unknown]"  # a value only known after `pulumi up` (an output), as `plain()` shows it

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
