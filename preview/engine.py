"""Run the real `__main__.py` under the Pulumi SDK's mock monitor and record every registration.

The config is passed exactly as the engine passes it (`set_all_config`, objects JSON-encoded, secret
keys named), so what runs here is what `pulumi up` runs, minus the cloud.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import logging
import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pulumi
import pulumi.resource as pulumi_resource
from pulumi._types import is_input_type
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_runtime_resource
from pulumi.runtime import rpc, settings
from pulumi.runtime.proto import source_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from preview import stackfile
from preview.mocks import StackMocks

PROJECT_DIR = Path(__file__).resolve().parent.parent
PROJECT = "deepspeed-stack"
SECRET = "[secret]"
_RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"


class Registration(msgspec.Struct):
    """One RegisterResource request, as the engine would receive it."""

    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    provider: str | None
    inputs: dict[str, Any]
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    protect: bool
    secret_paths: list[str] = msgspec.field(default_factory=list)
    ignore_changes: list[str] = msgspec.field(default_factory=list)
    # Resource options the engine acts on at replace and destroy time (not part of plan.json).
    delete_before_replace: bool = False
    retain_on_delete: bool = False
    # customTimeouts (create, update, delete) where set: how long the engine awaits the provider's readiness.
    custom_timeouts: dict[str, str] = msgspec.field(default_factory=dict)
    # The resource's transforms (the functions): a component's run on the children its provider registers (the
    # MPI operator's ConfigFile keeps its CRD on destroy this way); the mock monitor does not run them.
    transforms: list[Any] = msgspec.field(default_factory=list)
    # The name the (mock) provider gave the object: `name` or `metadata.name` of its state, for auto-named
    # resources (node pools, Kubernetes objects without a name). Not part of plan.json: it is an output.
    physical_name: str | None = None

    def to_plan(self) -> dict[str, Any]:
        return {"urn": self.urn, "type": self.type, "name": self.name, "parent": self.parent,
                "custom": self.custom, "provider": self.provider, "inputs": self.inputs,
                "dependencies": self.dependencies}


class RunResult(msgspec.Struct, dict=True):  # dict: index() keeps its lookup table as an attribute
    stack: str
    resources: list[Registration]
    outputs: dict[str, Any]
    # What the program logged with pulumi.log.warn (e.g. the planner's tight fits), in order: the preview
    # labels them in the terminal and lists them in summary.md and plan.json.
    warnings: list[str] = msgspec.field(default_factory=list)

    def by_type(self, type_: str) -> list[Registration]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registration:
        found = [r for r in self.by_type(type_) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {type_} {name or ''}, found {[r.name for r in found]}")
        return found[0]

    def get(self, urn: str) -> Registration:
        found = self.index().get(urn)
        if found is None:
            raise StopIteration(urn)
        return found

    def index(self) -> dict[str, Registration]:
        """URN -> registration; rebuilt when the list changed, so lookups stay O(1) on big stacks."""
        cached = getattr(self, "_index", None)
        if cached is None or len(cached) != len(self.resources):
            cached = {r.urn: r for r in self.resources}
            self._index = cached
        return cached

    def children(self, urn: str | None) -> list[Registration]:
        return [r for r in self.resources if r.parent == urn]

    def ancestors(self, reg: Registration) -> list[str]:
        out, parent, index = [], reg.parent, self.index()
        while parent:
            out.append(parent)
            parent = index[parent].parent if parent in index else None
        return out


def _from_value(value: Any, path: str, secrets: list[str]) -> Any:
    """Plain JSON of a serialized property, straight from the protobuf `Value`: secrets become "[secret]"
    (their paths collected), resource references their URN, whole-number doubles ints (the engine's JSON
    shows integers). One pass instead of json_format.MessageToDict plus a redaction pass: several times
    faster, and recording was a quarter of a 100-pool run's own cost (`make bench`)."""
    which = value.WhichOneof("kind")
    if which == "string_value":
        return value.string_value
    if which == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() else number
    if which == "bool_value":
        return value.bool_value
    if which == "struct_value":
        return _from_struct(value.struct_value.fields, path, secrets)
    if which == "list_value":
        return [_from_value(v, f"{path}[{i}]", secrets) for i, v in enumerate(value.list_value.values)]
    return None


def _from_struct(fields: Any, path: str, secrets: list[str]) -> Any:
    if rpc._special_sig_key in fields:  # `in`, not [], which would insert into the message
        sig = fields[rpc._special_sig_key].string_value
        if sig == rpc._special_secret_sig:
            secrets.append(path)
            return SECRET
        if sig == _RESOURCE_SIG:
            return fields["urn"].string_value if "urn" in fields else None
    return {k: _from_value(v, f"{path}.{k}" if path else k, secrets) for k, v in fields.items()}


def _physical_name(state: dict[str, Any]) -> str | None:
    meta = state.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else state.get("name")
    return name if isinstance(name, str) else None


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        secrets: list[str] = []
        reg = Registration(
            urn=urn, type=request.type, name=request.name, parent=request.parent or None,
            custom=bool(request.custom), provider=request.provider.rsplit("::", 1)[0] or None,
            inputs=_from_struct(request.object.fields, "", secrets), dependencies=sorted(set(request.dependencies)),
            property_dependencies={k: sorted(v.urns) for k, v in request.propertyDependencies.items()},
            protect=bool(request.protect), secret_paths=secrets, ignore_changes=list(request.ignoreChanges),
            delete_before_replace=bool(request.deleteBeforeReplace),
            retain_on_delete=bool(request.retainOnDelete),
            custom_timeouts={op: value for op in ("create", "update", "delete")
                             if (value := getattr(request.customTimeouts, op))},
            transforms=pulumi_mocks._resolve_callbacks(request.transforms),
        )
        self.registrations.append(reg)  # the SDK calls from several threads: keep our own reference
        response = super().RegisterResource(request)
        if reg.custom:
            reg.physical_name = _physical_name(self.resources[urn].state)
        return response


class RecordingLogger(logging.Logger):
    """The mock engine's logger: keeps what the program logs instead of printing it unlabelled.
    `pulumi.log.warn` reaches the mock engine, which calls `logger.warning`."""

    def __init__(self) -> None:
        # WARNING: debug and info messages were dropped anyway (no handler); this skips building their records.
        super().__init__("deepspeed-stack.preview", logging.WARNING)
        self.propagate = False
        self.warnings: list[str] = []

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self.warnings.append(str(msg))


def stack_file(stack: str) -> Path:
    return PROJECT_DIR / f"Pulumi.{stack}.yaml"


def stacks() -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in PROJECT_DIR.glob("Pulumi.*.yaml"))


def engine_config_from_yaml(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Stack-file config -> the engine's form: namespaced keys, string values, objects as JSON.
    A `secure:` value (ciphertext we cannot decrypt here) becomes "[secret]" and its key a secret key."""
    values, secret_keys = {}, []

    def plain(v: Any, key: str) -> Any:
        if isinstance(v, dict) and set(v) == {"secure"}:
            secret_keys.append(key)
            return SECRET
        if isinstance(v, dict):
            return {k: plain(x, key) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x, key) for x in v]
        return v

    for key, value in (config or {}).items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        v = plain(value, full)
        values[full] = v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else (
            str(v).lower() if isinstance(v, bool) else str(v))
    return values, sorted(set(secret_keys))


def load_stack_config(stack: str) -> tuple[dict[str, str], list[str]]:
    return engine_config_from_yaml(stackfile.read(stack_file(stack)))


@contextlib.contextmanager
def _in_project() -> Iterator[None]:
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(PROJECT_DIR)
    if str(PROJECT_DIR) not in sys.path:
        sys.path.insert(0, str(PROJECT_DIR))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during a run. The provider SDKs leave hundreds of thousands of
    long-lived objects (their generated classes); the run allocates many short-lived ones (Outputs,
    futures, protobuf messages), which triggers full collections that walk all of them. Measured by
    `make bench`: collections were two thirds of a 100-pool run. A run is short; memory is freed by
    reference counting as usual, and the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def no_source_positions() -> Iterator[None]:
    """The SDK walks the whole Python stack at every resource to send the engine its source position (for the
    CLI's display); the mock monitor drops it. Under pytest, stacks are deep: it was a fifth of a run's time.
    An empty trace is what the SDK itself sends when it finds no user frame."""
    original = getattr(pulumi_runtime_resource, "_get_stack_trace", None)
    if original is None:  # an SDK without it: nothing to skip
        yield
        return
    pulumi_runtime_resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        pulumi_runtime_resource._get_stack_trace = original


@contextlib.contextmanager
def construction_order() -> Iterator[dict[tuple[str, str], int]]:
    """(type, name) -> the order the program constructed the resource in. The SDK sends RegisterResource
    from several threads once each resource's inputs resolve, so arrival order varies from run to run;
    construction order is the program's own, so plans and trees are identical across runs."""
    order: dict[tuple[str, str], int] = {}
    original = pulumi_resource.register_resource

    def recording(res: Any, ty: str, name: str, *args: Any, **kwargs: Any) -> None:
        order.setdefault((ty, name), len(order))
        return original(res, ty, name, *args, **kwargs)

    pulumi_resource.register_resource = recording
    try:
        yield order
    finally:
        pulumi_resource.register_resource = original


def _resolve(value: Any) -> tuple[Any, bool]:
    """An exported value resolved, and whether any Output in it is secret: what `Output.from_input(value)` gives,
    without first wrapping every plain leaf in an Output of its own (for `costs` and `capacityPlan` of a 100-pool
    stack that was a fifth of the run)."""
    secret = False

    def walk(v: Any) -> Any:
        nonlocal secret
        if isinstance(v, pulumi.Output):
            secret = secret or bool(_sync_await(v.is_secret()))
            return walk(_sync_await(v.future()))
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str | int | float | bool) or v is None:
            return v
        return walk(pulumi.Output.from_input(v)) if inspect.isawaitable(v) or is_input_type(type(v)) else v

    return walk(value), secret


def _stack_outputs() -> dict[str, Any]:
    root = settings.get_root_resource()
    result = {}
    for name, value in getattr(root, "outputs", {}).items():
        resolved, secret = _resolve(value)
        result[name] = SECRET if secret else resolved
    return result


def run_program(config: dict[str, str], secret_keys: list[str] | None = None, stack: str = "test",
                mocks: pulumi.runtime.Mocks | None = None) -> RunResult:
    """Run `__main__.py` once with this engine config; raises what the program raises (e.g. ConfigError)."""
    project_id = config.get("gcp:project", "my-gcp-project")
    monitor = RecordingMonitor(mocks or StackMocks(project_id, config.get("gcp:region", "us-central1")))
    logger = RecordingLogger()
    settings.ROOT.set(None)
    pulumi.runtime.set_all_config(dict(config), list(secret_keys or []))
    pulumi_mocks.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor,
                           logger=logger)
    settings.SETTINGS.rpc_manager.clear()
    settings.SETTINGS.outputs.clear()
    with _in_project(), gc_paused(), no_source_positions(), construction_order() as order:
        _sync_await(run_pulumi_func(lambda: runpy.run_path(str(PROJECT_DIR / "__main__.py"), run_name="__main__")))
        outputs = _stack_outputs()
    resources = sorted(monitor.registrations, key=lambda r: order.get((r.type, r.name), len(order)))
    return RunResult(stack=stack, resources=resources, outputs=outputs, warnings=list(logger.warnings))


def run_stack(stack: str, overrides: dict[str, Any] | None = None) -> RunResult:
    """Run a stack file of the repo; `overrides` replace top-level keys (values as in the YAML)."""
    config, secret_keys = load_stack_config(stack)
    if overrides:
        extra, extra_secrets = engine_config_from_yaml(overrides)
        config.update(extra)
        secret_keys = sorted(set(secret_keys) | set(extra_secrets))
    return run_program(config, secret_keys, stack=stack)
