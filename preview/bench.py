"""`make bench`: what the program costs over the bare Pulumi SDK declaring the same resources, start-up included.

For every stack file, and for stacks generated from dev with 25 and 100 GPU pools (10 workloads), PAIRS pairs of
fresh processes, each timed in CPU seconds from the interpreter's start to its exit, the best of each kind kept
(the run least disturbed by whatever else the machine does):

  program  the real __main__.py under the preview's mock monitor (imports, config, checks, components,
           recording): what `python -m preview` and `pulumi up` run;
  bare     the same registrations (types, names, parents, providers, inputs) through the provider SDKs'
           resource classes under the same mocks and harness: what any program declaring them pays.

ratio = best program / best bare. Goal: at most 1.3 on every stack, 1.15 on the large ones (LARGE resources or
more). CPU time, not wall time: other work on the machine slows both alike. A benchmark, not a test.

    python -m preview.bench [--pairs 3] [--jobs 2] [--pools 25,100] [--stack dev --stack prod]
    python -m preview.bench --profile dev      # cProfile of one cold program run in this process
"""

from __future__ import annotations

# Imports stay inside functions: a worker process pays only what its task needs, so `bare` is not charged for
# the program's modules (nor `program` for the benchmark's).
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROJECT = "deepspeed-stack"
PROJECT_DIR = Path(__file__).resolve().parent.parent
GOAL, GOAL_LARGE, LARGE = 1.3, 1.15, 100
DEFAULT_POOLS = (25, 100)
WORKLOADS = 10


# --- generated stacks ----------------------------------------------------------------------------

def stack_config(stack: str) -> dict[str, Any]:
    from preview.engine import stack_file
    from preview.stackfile import read

    return read(stack_file(stack))


def generate(pools: int, workloads: int = WORKLOADS, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dev stack's config (as in the YAML file) with `pools` copies of its GPU pool and up to `workloads`
    copies of its first workload, each on its own pool."""
    import copy

    config = copy.deepcopy(base if base is not None else stack_config("dev"))
    key = f"{PROJECT}:nodePools"
    template = config[key][0]
    config[key] = [{**copy.deepcopy(template), "name": f"gpu{i:03d}"} for i in range(pools)]
    wkey = f"{PROJECT}:workloads"
    existing = config.get(wkey) or {}
    if existing and workloads:
        name, first = next(iter(existing.items()))
        config[wkey] = {
            f"{name}-{i:02d}": {**copy.deepcopy(first), "pool": f"gpu{i:03d}", "namespace": f"{name}-{i:02d}"}
            for i in range(min(workloads, pools))
        }
    else:
        config.pop(wkey, None)
    return config


# --- the two workers (each a fresh interpreter) ------------------------------------------------------

def worker_program(engine_config: dict[str, str], secret_keys: list[str], stack: str) -> dict[str, Any]:
    from preview.engine import run_program

    run = run_program(engine_config, secret_keys, stack=stack)
    cpu = time.process_time()  # before anything else allocates: the collector, back on, would run on the bench's time
    return {"cpu": cpu, "resources": [r.to_plan() for r in run.resources]}


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def provider_class(type_token: str) -> Any:
    """The provider SDK's class for a type token (gcp:container/nodePool:NodePool -> pulumi_gcp.container.NodePool),
    or None where the SDK has none (custom resources such as MPIJob)."""
    import importlib

    package, module, name = type_token.split(":")
    if package == "pulumi" and module == "providers":
        candidates = [(f"pulumi_{name.replace('-', '_')}", "Provider")]
    elif package == "kubernetes":
        group, _, version = module.rpartition("/")
        candidates = [(f"pulumi_kubernetes.{group.split('.')[0]}.{version}", name)]  # helm.sh -> helm
    else:
        candidates = [(f"pulumi_{package.replace('-', '_')}.{module.split('/')[0]}", name),
                      (f"pulumi_{package.replace('-', '_')}", name)]
    for mod_name, attr in candidates:
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError):
            continue
    return None


def _typed(cls: Any, r: dict[str, Any], opts: Any) -> Any:
    """`cls(name, **inputs)`, the recorded camelCase inputs as the class's snake_case keyword arguments."""
    import inspect

    params = inspect.signature(cls._internal_init).parameters
    kwargs = {}
    for key, value in r["inputs"].items():
        for candidate in (_snake(key), key):
            if candidate in params and candidate not in ("resource_name", "opts"):
                kwargs[candidate] = value
                break
    return cls(r["name"], opts=opts, **kwargs)


def register_bare(resources: list[dict[str, Any]]) -> None:
    """The same registrations through the provider SDKs' classes: no config, no checks, no component logic."""
    import pulumi

    made: dict[str, pulumi.Resource] = {}
    for r in resources:
        parent = made.get(r["parent"] or "")
        opts = pulumi.ResourceOptions(parent=parent, provider=made.get(r["provider"] or ""))
        # A provider's own components (kubernetes:yaml/v2:ConfigFile) through their SDK class too: that class is
        # what any program declaring one imports (pulumi_kubernetes.yaml pulls in requests, ~0.1 s).
        cls = provider_class(r["type"]) if r["custom"] or not r["type"].startswith(f"{PROJECT}:") else None
        if cls is not None:
            res: pulumi.Resource = _typed(cls, r, opts)
        elif r["custom"] and r["type"].startswith("kubernetes:") and "apiVersion" in r["inputs"]:
            from pulumi_kubernetes.apiextensions import CustomResource

            inputs = r["inputs"]
            res = CustomResource(r["name"], inputs["apiVersion"], inputs["kind"], spec=inputs.get("spec"),
                                 metadata=inputs.get("metadata"), opts=opts)
        elif r["custom"]:
            res = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)
        else:
            res = pulumi.ComponentResource(r["type"], r["name"], None, pulumi.ResourceOptions(parent=parent))
        made[r["urn"]] = res


def worker_bare(resources: list[dict[str, Any]], stack: str, project_id: str, region: str) -> dict[str, Any]:
    import pulumi
    from pulumi.runtime import mocks as pulumi_mocks
    from pulumi.runtime import settings
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from preview.engine import gc_paused, no_source_positions
    from preview.mocks import StackMocks

    settings.ROOT.set(None)
    pulumi.runtime.set_all_config({}, [])
    pulumi_mocks.set_mocks(StackMocks(project_id, region), project=PROJECT, stack=stack, preview=False)
    with gc_paused(), no_source_positions():  # the conditions of the program's run (engine.run_program)
        _sync_await(run_pulumi_func(lambda: register_bare(resources)))
    return {"cpu": time.process_time()}


def _worker_main(task: str, path: str) -> None:
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    if task == "program":
        result = worker_program(payload["config"], payload["secretKeys"], payload["stack"])
    else:
        result = worker_bare(payload["resources"], payload["stack"], payload["project"], payload["region"])
    print(json.dumps(result))


# --- measuring -----------------------------------------------------------------------------------

def _spawn(task: str, payload: dict[str, Any], folder: Path) -> dict[str, Any]:
    path = folder / f"{task}-{id(payload)}-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "preview.bench", "--worker", task, str(path)], cwd=PROJECT_DIR,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{task} worker failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(label: str, config: dict[str, Any], stack: str, pairs: int, folder: Path) -> dict[str, Any]:
    """`pairs` x (program, bare), alternating, each in a fresh process; the first program run gives the
    registrations the bare runs make."""
    from preview.engine import engine_config_from_yaml

    engine_config, secret_keys = engine_config_from_yaml(config)
    program_payload = {"config": engine_config, "secretKeys": secret_keys, "stack": stack}
    programs, bares, resources = [], [], None
    for _ in range(pairs):
        run = _spawn("program", program_payload, folder)
        programs.append(run["cpu"])
        if resources is None:
            resources = run["resources"]
        bares.append(_spawn("bare", {"resources": resources, "stack": stack,
                                     "project": engine_config.get("gcp:project", "my-gcp-project"),
                                     "region": engine_config.get("gcp:region", "us-central1")}, folder)["cpu"])
    program, bare = min(programs), min(bares)
    return {"label": label, "resources": len(resources or []), "program": program, "bare": bare,
            "ratio": program / bare}


def goal(m: dict[str, Any]) -> float:
    return GOAL_LARGE if m["resources"] >= LARGE else GOAL


def row(m: dict[str, Any]) -> str:
    verdict = "ok" if m["ratio"] <= goal(m) else "over"
    return (f"{m['label']:<22} {m['resources']:>5} {m['bare']:>7.2f} {m['program']:>8.2f} {m['ratio']:>6.2f} "
            f"{goal(m):>5.2f}  {verdict}")


def profile(stack: str, top: int = 30) -> None:
    """cProfile of one cold program run (imports and data parsing included) in this process."""
    import cProfile
    import pstats

    from preview.engine import load_stack_config, run_program

    config, secret_keys = load_stack_config(stack)
    prof = cProfile.Profile()
    prof.enable()
    run_program(config, secret_keys, stack=stack)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preview.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="program/bare pairs per stack (the best kept; default 3)")
    parser.add_argument("--jobs", type=int, default=2, help="stacks measured at once (default 2)")
    parser.add_argument("--pools", default=",".join(map(str, DEFAULT_POOLS)), help="generated pool counts")
    parser.add_argument("--stack", action="append", help="only this stack file (repeatable)")
    parser.add_argument("--profile", metavar="STACK", help="profile one cold run of STACK instead")
    parser.add_argument("--worker", nargs=2, metavar=("TASK", "PAYLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(*args.worker)
        return 0
    if args.profile:
        profile(args.profile)
        return 0

    import compileall
    import concurrent.futures
    import tempfile

    from preview.engine import stacks

    # Bytecode of the project written first (the provider SDKs' is compiled at install), so no run pays for it.
    for package in ("model", "policy", "planner", "workloads", "components", "checks", "preview"):
        compileall.compile_dir(PROJECT_DIR / package, quiet=1)
    rows = [(s, stack_config(s), s) for s in (args.stack or stacks())]
    if not args.stack:
        rows += [(f"generated {n} pools", generate(n), "bench") for n in
                 sorted(int(n) for n in args.pools.split(",") if n)]
    print(f"CPU seconds per fresh process, best of {args.pairs}: bare = the provider SDKs registering the same "
          "resources; program = __main__.py. ratio = program / bare; goal at most "
          f"{GOAL} ({GOAL_LARGE} from {LARGE} resources).")
    print(f"{'stack':<22} {'res':>5} {'bare':>7} {'program':>8} {'ratio':>6} {'goal':>5}")
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(measure, label, config, stack, args.pairs, Path(tmp)) for label, config, stack in rows]
        measured = []
        for future in futures:  # in order, each as soon as it and those before it are done
            measured.append(future.result())
            print(row(measured[-1]), flush=True)
    over = [m["label"] for m in measured if m["ratio"] > goal(m)]
    print(f"\n{len(measured) - len(over)} of {len(measured)} within the goal" + (f"; over: {', '.join(over)}"
                                                                              if over else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
