"""Benchmark of the offline preview (`make bench`): how much the program's own work costs on top of the
Pulumi SDK, and whether that cost grows linearly with the number of GPU pools.

For every stack file, and for stacks generated from dev with 25/50/100 GPU node pools (and 10 workloads
when the dev stack has one to copy), it times in a fresh process:

  program  the real __main__.py under the mock monitor (config load and checks, components, recording),
           then the preview's own steps (plan, policies, summary, manifests);
  floor    the bare SDK registering the same resources (same types, names, parents, providers, inputs)
           under the same mocks, with no config, no components' logic and no recording.

Provider SDK imports (pulumi_gcp, pulumi_kubernetes, ...) are timed separately in both processes and left
out of the ratio: they are the same for any program that uses those providers. A benchmark, not a test:
nothing asserts timings. The goal: program <= 1.3 x floor, and a constant per-pool cost.

    python -m preview.bench [--repeat 1] [--jobs 2] [--pools 25,100] [--profile]

`make bench` runs the defaults: per row one fresh process that runs the program once cold (loading every
module), then bare, floor and the program again, warm, side by side (so a row's ratio compares runs in the
same process under the same load); two rows at a time. That keeps it within a minute on a 2-core machine.
`--fresh` times each run (bare, floor, program) in its own fresh process instead (cold, minutes); `--repeat 3
--jobs 1` gives medians on a quiet machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import importlib
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import yaml

from preview.engine import PROJECT, PROJECT_DIR, engine_config_from_yaml, stack_file, stacks

PROVIDER_PACKAGES = ("pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_docker_build", "pulumi_policy")
GOAL_RATIO = 1.3
DEFAULT_POOLS = (25, 100)
WORKLOADS = 10


# --- generated stacks ----------------------------------------------------------------------------

def stack_config(stack: str) -> dict[str, Any]:
    with open(stack_file(stack), encoding="utf-8") as fh:
        return (yaml.safe_load(fh) or {}).get("config") or {}


def generate(pools: int, workloads: int = WORKLOADS, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dev stack's config (as in the YAML file) with `pools` copies of its GPU pool and up to
    `workloads` copies of its first workload, each on its own pool. Without a workload to copy (or with
    workloads=0), pools only."""
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


def validated(config: dict[str, Any]) -> bool:
    """Whether the generated config passes the program's own validation (checks.load)."""
    from checks import ConfigError, load

    engine_cfg, secret_keys = engine_config_from_yaml(config)
    try:
        load(engine_cfg, set(secret_keys))
    except ConfigError:
        return False
    return True


# --- the two workers (each runs in a fresh interpreter) --------------------------------------------

def _import_providers(modules: list[str]) -> float:
    """Import (and force-load: the provider SDKs load submodules lazily) the provider SDK modules a program
    run uses, so their import time stays out of both measurements."""
    start = time.perf_counter()
    for name in (*PROVIDER_PACKAGES, *modules):
        getattr(importlib.import_module(name), "__all__", None)  # any non-introspection attribute loads it
    return time.perf_counter() - start


def loaded_provider_modules() -> list[str]:
    return sorted(name for name, mod in sys.modules.items()
                  if name.split(".")[0] in PROVIDER_PACKAGES and type(mod) is types.ModuleType)


def worker_probe(config: dict[str, Any], stack: str) -> dict[str, Any]:
    """Which provider SDK modules one run of the program loads."""
    from preview.engine import run_program

    engine_cfg, secret_keys = engine_config_from_yaml(config)
    run_program(engine_cfg, secret_keys, stack=stack)
    return {"modules": loaded_provider_modules()}


def worker_program(config: dict[str, Any], stack: str, modules: list[str]) -> dict[str, Any]:
    imports = _import_providers(modules)
    from policy.rules import POLICIES
    from preview import manifests, plan, policy_check, summary
    from preview.engine import run_program

    engine_cfg, secret_keys = engine_config_from_yaml(config)
    start = time.perf_counter()
    run = run_program(engine_cfg, secret_keys, stack=stack)
    ran = time.perf_counter()
    plan.dumps(plan.build(run))
    violations = policy_check.evaluate(run)
    summary.markdown(run, violations, len(POLICIES))
    manifests.render(run)
    done = time.perf_counter()
    resources = [{**r.to_plan(), "protect": r.protect} for r in run.resources]
    return {"imports": imports, "run": ran - start, "post": done - ran, "resources": resources}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def provider_class(type_token: str) -> Any:
    """The provider SDK's resource class for a type token (gcp:container/nodePool:NodePool ->
    pulumi_gcp.container.NodePool), or None when the SDK has none (custom resources like MPIJob)."""
    package, module, name = type_token.split(":")
    if package == "pulumi" and module == "providers":
        candidates = [(f"pulumi_{name.replace('-', '_')}", "Provider")]
    elif package == "kubernetes":
        group, _, version = module.rpartition("/")
        # helm.sh -> helm, rbac.authorization.k8s.io -> rbac; CRDs (kubeflow.org) have no class
        candidates = [(f"pulumi_kubernetes.{group.split('.')[0]}.{version}", name)]
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
    """`cls(name, **inputs)` with the recorded camelCase inputs as the class's snake_case keyword args
    (nested values stay dicts, which the SDK accepts for input types)."""
    params = inspect.signature(cls._internal_init).parameters
    kwargs = {}
    for key, value in r["inputs"].items():
        for candidate in (_snake(key), key):
            if candidate in params and candidate not in ("resource_name", "opts"):
                kwargs[candidate] = value
                break
    return cls(r["name"], opts=opts, **kwargs)


def register_floor(resources: list[dict[str, Any]], typed: bool = True) -> None:
    """The same registrations through the bare SDK: no config, no validation, no component code, no
    recording. `typed`: through the provider SDKs' resource classes, as any program using them pays
    (the fair floor for the program's own work); otherwise as generic CustomResources (the SDK core)."""
    import pulumi

    made: dict[str, pulumi.Resource] = {}
    for r in resources:
        parent = made.get(r["parent"] or "")
        opts = pulumi.ResourceOptions(parent=parent, provider=made.get(r["provider"] or ""))
        cls = provider_class(r["type"]) if typed and r["custom"] else None
        if cls is not None:
            res: pulumi.Resource = _typed(cls, r, opts)
        elif typed and r["type"].startswith("kubernetes:") and "apiVersion" in r["inputs"]:
            from pulumi_kubernetes.apiextensions import CustomResource

            inputs = r["inputs"]
            res = CustomResource(r["name"], inputs["apiVersion"], inputs["kind"], spec=inputs.get("spec"),
                                 metadata=inputs.get("metadata"), opts=opts)
        elif r["type"].startswith("pulumi:providers:"):
            res = pulumi.ProviderResource(r["type"].split(":")[-1], r["name"], r["inputs"],
                                          pulumi.ResourceOptions(parent=parent))
        elif r["custom"]:
            res = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)
        else:
            res = pulumi.ComponentResource(r["type"], r["name"], None, pulumi.ResourceOptions(parent=parent))
        made[r["urn"]] = res


def worker_floor(resources: list[dict[str, Any]], stack: str, project_id: str, region: str,
                 modules: list[str], typed: bool) -> dict[str, Any]:
    imports = _import_providers(modules)
    import pulumi
    from pulumi.runtime import mocks as pulumi_mocks
    from pulumi.runtime import settings
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from preview.engine import gc_paused, no_source_positions
    from preview.mocks import StackMocks

    mocks = StackMocks(project_id, region)
    settings.ROOT.set(None)
    pulumi.runtime.set_all_config({}, [])
    pulumi_mocks.set_mocks(mocks, project=PROJECT, stack=stack, preview=False)
    start = time.perf_counter()
    with gc_paused(), no_source_positions():  # the same conditions as the program's run (engine.run_program)
        _sync_await(run_pulumi_func(lambda: register_floor(resources, typed)))
    return {"imports": imports, "run": time.perf_counter() - start}


def _floor_run(resources: list[dict[str, Any]], stack: str, project_id: str, region: str, typed: bool) -> float:
    import pulumi
    from pulumi.runtime import mocks as pulumi_mocks
    from pulumi.runtime import settings
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from preview.engine import gc_paused
    from preview.mocks import StackMocks

    settings.ROOT.set(None)
    pulumi.runtime.set_all_config({}, [])
    pulumi_mocks.set_mocks(StackMocks(project_id, region), project=PROJECT, stack=stack, preview=False)
    settings.SETTINGS.rpc_manager.clear()
    start = time.perf_counter()
    with gc_paused():
        _sync_await(run_pulumi_func(lambda: register_floor(resources, typed)))
    return time.perf_counter() - start


def worker_row(config: dict[str, Any], stack: str) -> dict[str, Any]:
    """One row side by side in one process: a first (cold) program run loads every module it needs (its
    time less the warm run's is reported as imports); then bare, floor and the program again, each warm, so
    all three pay the same: only the registrations and the program's own work."""
    from policy.rules import POLICIES
    from preview import manifests, plan, policy_check, summary
    from preview.engine import run_program

    engine_cfg, secret_keys = engine_config_from_yaml(config)
    start = time.perf_counter()
    first = run_program(engine_cfg, secret_keys, stack=stack)
    cold = time.perf_counter() - start
    resources = [{**r.to_plan(), "protect": r.protect} for r in first.resources]
    project, region = config.get("gcp:project", "my-gcp-project"), config.get("gcp:region", "us-central1")
    bare = _floor_run(resources, stack, project, region, typed=False)
    floor = _floor_run(resources, stack, project, region, typed=True)
    start = time.perf_counter()
    run = run_program(engine_cfg, secret_keys, stack=stack)
    ran = time.perf_counter()
    plan.dumps(plan.build(run))
    summary.markdown(run, policy_check.evaluate(run), len(POLICIES))
    manifests.render(run)
    done = time.perf_counter()
    return {"imports": cold - (ran - start), "run": ran - start, "post": done - ran, "floor": floor, "bare": bare,
            "resources": len(resources)}


PYCACHE = Path(tempfile.gettempdir()) / "deepspeed-stack-bench-pycache"


def _worker_env() -> dict[str, str]:
    """Workers cache bytecode as any normal run does, but under a temp prefix (not __pycache__ in the
    checkout), also where PYTHONDONTWRITEBYTECODE is set: compiling ~40 project modules on every start
    would otherwise be measured as the program's work."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def _spawn(task: str, payload: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(payload, fh)
    out = subprocess.run([sys.executable, "-m", "preview.bench", "--worker", task, fh.name], cwd=PROJECT_DIR,
                         capture_output=True, text=True, check=False, env=_worker_env())
    Path(fh.name).unlink(missing_ok=True)
    if out.returncode != 0:
        raise RuntimeError(f"{task} worker failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _worker_main(task: str, path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        payload = json.load(fh)
    if task == "probe":
        result = worker_probe(payload["config"], payload["stack"])
    elif task == "row":
        result = worker_row(payload["config"], payload["stack"])
    elif task == "program":
        result = worker_program(payload["config"], payload["stack"], payload["modules"])
    else:
        result = worker_floor(payload["resources"], payload["stack"], payload["project"], payload["region"],
                              payload["modules"], task == "floor")
    print(json.dumps(result))


# --- measuring -----------------------------------------------------------------------------------

def measure_row(label: str, config: dict[str, Any], stack: str, repeat: int) -> dict[str, Any]:
    """The default: each run one process measuring bare, floor and program side by side (warm)."""
    rows = [_spawn("row", {"config": config, "stack": stack}) for _ in range(repeat)]
    return {"label": label, "resources": rows[0]["resources"],
            **{k: statistics.median(r[k] for r in rows) for k in ("run", "post", "floor", "bare", "imports")}}


def measure(label: str, config: dict[str, Any], stack: str, repeat: int) -> dict[str, Any]:
    modules = _spawn("probe", {"config": config, "stack": stack})["modules"]
    programs = [_spawn("program", {"config": config, "stack": stack, "modules": modules}) for _ in range(repeat)]
    resources = programs[0]["resources"]
    payload = {"resources": resources, "stack": stack, "project": config.get("gcp:project", "my-gcp-project"),
               "region": config.get("gcp:region", "us-central1"), "modules": modules}
    floors = [_spawn("floor", payload) for _ in range(repeat)]
    bare = [_spawn("bare", payload) for _ in range(repeat)]
    return {"label": label, "resources": len(resources),
            "run": statistics.median(p["run"] for p in programs),
            "post": statistics.median(p["post"] for p in programs),
            "floor": statistics.median(f["run"] for f in floors),
            "bare": statistics.median(f["run"] for f in bare),
            "imports": statistics.median(p["imports"] for p in programs)}


def _row(m: dict[str, Any]) -> str:
    ratio = m["run"] / m["floor"] if m["floor"] else float("nan")
    total_ratio = (m["run"] + m["post"]) / m["floor"] if m["floor"] else float("nan")
    per = 1000 * m["run"] / max(m["resources"], 1)
    flag = "ok" if ratio <= GOAL_RATIO else "over"
    return (f"{m['label']:<26} {m['resources']:>5} {m['bare']:>7.3f} {m['floor']:>7.3f} {m['run']:>8.3f} "
            f"{m['post']:>8.3f} {ratio:>6.2f} {total_ratio:>6.2f} {per:>7.2f}  {flag}")


def profile(config: dict[str, Any], stack: str, top: int = 25) -> None:
    """cProfile of one program run in this process: what dominates."""
    import cProfile
    import pstats

    from preview.engine import run_program

    engine_cfg, secret_keys = engine_config_from_yaml(config)
    run_program(engine_cfg, secret_keys, stack=stack)  # warm: imports and caches out of the profile

    prof = cProfile.Profile()
    prof.enable()
    run_program(engine_cfg, secret_keys, stack=stack)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preview.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (median; default 1)")
    parser.add_argument("--jobs", type=int, default=2, help="rows measured at once (default 2)")
    parser.add_argument("--fresh", action="store_true",
                        help="program, floor and bare each in a fresh process (cold; slower: minutes)")
    parser.add_argument("--pools", default=",".join(map(str, DEFAULT_POOLS)), help="generated pool counts")
    parser.add_argument("--profile", action="store_true", help="profile the largest generated stack")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "PAYLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(*args.worker)
        return 0

    counts = sorted(int(n) for n in args.pools.split(",") if n)
    how_run = " in fresh processes" if args.fresh else ", warm, side by side"
    print(f"seconds, median of {args.repeat} run(s){how_run}. bare: the SDK core registering the same resources "
          "as generic CustomResources; floor: the same through the provider SDKs' classes; program: the real "
          f"__main__.py; preview: plan, policies, summary, manifests.\nratio = program / floor (goal <= {GOAL_RATIO}); "
          "total = (program + preview) / floor")
    print(f"{'stack':<26} {'res':>5} {'bare':>7} {'floor':>7} {'program':>8} {'preview':>8} {'ratio':>6} "
          f"{'total':>6} {'ms/res':>7}")
    rows = [(stack, stack_config(stack), stack) for stack in stacks()]
    for n in counts:
        config = generate(n)
        if not validated(config):
            config = generate(n, workloads=0)  # the workload schema is not usable: pools only
        wl = len(config.get(f"{PROJECT}:workloads") or {})
        rows.append((f"generated {n} pools/{wl} wl", config, "bench"))
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each row's workers are processes
        how = measure if args.fresh else measure_row
        futures = [pool.submit(how, label, config, stack, args.repeat) for label, config, stack in rows]
        measured = []
        for future in futures:  # in order, each as soon as it and those before it are done
            measured.append(future.result())
            print(_row(measured[-1]), flush=True)
    results = measured[:len(stacks())]
    scaled = list(zip(counts, measured[len(stacks()):], strict=True))
    imports = statistics.median(m["imports"] for m in results) if results else 0.0
    print(f"\nprovider SDK imports (same for both, not in the ratio): {imports:.2f} s")
    if len(scaled) >= 2:
        (n0, m0), (n1, m1) = scaled[0], scaled[-1]
        marginal = 1000 * (m1["run"] - m0["run"]) / (n1 - n0)
        floor_marginal = 1000 * (m1["floor"] - m0["floor"]) / (n1 - n0)
        print(f"per GPU pool, {n0} -> {n1} pools: program {marginal:.1f} ms, SDK floor {floor_marginal:.1f} ms")
        for n, m in scaled:
            print(f"  {n:>4} pools: {1000 * m['run'] / n:.1f} ms per pool (program), "
                  f"{1000 * m['floor'] / n:.1f} ms (floor)")
    if args.profile and counts:
        profile(generate(counts[-1]), "bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
