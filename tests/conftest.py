"""Shared fixtures: stack runs under mocks (cached), ../shared references.

The project's modules, jsonschema and kubernetes-validate are imported where first used, not here: with
`pytest -n 2` the xdist controller imports this file too, before it starts the workers, and runs no test
(0.35 s of the suite's wall time)."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import importlib
import itertools
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from model.types import StackConfig
    from preview.engine import RunResult

PROJECT_DIR = Path(__file__).resolve().parent.parent
# ../shared: the reference copies and seed documents the project came from. A user's clone has none, so a test reads
# them only through reference() and seed(), which skip when they are absent; what a test needs in every clone is a
# fact in data/ or tests/ with its source (tests/test_lone_clone.py holds every test module to that).
SHARED_DIR = PROJECT_DIR.parent / "shared"
SHARED = SHARED_DIR / "reference"
# The example stacks as the project ships them, which the tests that pin an example's values read: the stack files
# beside Pulumi.yaml are the user's to edit (or to add to), and only the checks every stack must pass (schema,
# policy, manifests, preview) run over them (`stacks()`). `make examples-check` (CI) says when they differ.
EXAMPLES_DIR = PROJECT_DIR / "tests" / "examples"

_RUNS: dict[str, RunResult] = {}


@pytest.fixture(scope="session", autouse=True)
def _kubernetes_validate_reads_its_files_once() -> None:
    # kubernetes-validate re-reads its 1.4 MB definitions file (and the kind's schema) from disk on every call:
    # 20 ms a call, ~10x the validation itself. The files are the package's own, read-only data: read each once.
    import kubernetes_validate.utils

    if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
        kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


# The cyclic garbage collector walks every tracked object on each full collection; the provider SDKs, imported
# lazily by the first stack runs, leave ~450k long-lived ones, which made GC ~10 % of the suite's CPU time.
# Once imports have grown, collect and freeze what is alive (gc.freeze: moved out of the collector's reach, never
# freed, which is what those modules are anyway). Test outcomes do not depend on it.
_FROZEN_AT_MODULES = 0


def _freeze_long_lived_objects() -> None:
    global _FROZEN_AT_MODULES
    if len(sys.modules) > _FROZEN_AT_MODULES + 30:
        gc.collect()
        gc.freeze()
        _FROZEN_AT_MODULES = len(sys.modules)


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_long_lived_objects()


# pytest rewrites each test module's asserts before its first import and caches the result in __pycache__
# (*.pytest-*.pyc, written whole by rename). In a fresh checkout both xdist workers rewrote every module, at the same
# moment: ~2.5 s of CPU each, a sixth of a worker's share of `make test`. Each worker now first imports its own half
# of the modules (split by size), so each rewrite is done once and the other worker reads the cached one when its
# collection reaches the module. Collection is unchanged: the same modules, collected in the same order.
@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or sys.dont_write_bytecode:
        return
    # Only the modules this run collects (`pytest -n 2 tests/test_x.py` imports that one alone).
    args = [Path(session.config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in session.config.args]
    modules = [path for path in PROJECT_DIR.joinpath("tests").glob("test_*.py")
               if any(path == arg or arg in path.parents for arg in args)]
    for path in _share(modules, int(worker.removeprefix("gw")), count):
        # A module that fails to import here is imported again by the collection, which reports it as usual.
        with contextlib.suppress(Exception, pytest.skip.Exception, pytest.fail.Exception):
            importlib.import_module(path.stem)  # tests/ is on sys.path (pyproject's pythonpath)


def _share(modules: list[Path], index: int, count: int) -> list[Path]:
    """Worker `index`'s modules: the largest first, each to the worker with the fewest bytes so far (every worker
    computes the same split from the same files)."""
    shares: list[list[Path]] = [[] for _ in range(count)]
    sizes = [0] * count
    for path in sorted(modules, key=lambda p: (-p.stat().st_size, p.name)):
        lightest = sizes.index(min(sizes))
        shares[lightest].append(path)
        sizes[lightest] += path.stat().st_size
    return sorted(shares[index])


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _freeze_long_lived_objects()


def validate_json(instance: Any, schema: dict[str, Any]) -> None:
    """`jsonschema.validate`, same checks and same error (best_match), but each schema is checked against its
    metaschema once per session: that check was nearly all of its cost (0.2 s for the chart's values schema,
    which several tests use)."""
    import jsonschema

    validator = _checked_validator(json.dumps(schema, sort_keys=True))
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is not None:
        raise error


@functools.cache
def _checked_validator(schema_json: str) -> Any:
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def yaml_load(stream: Any) -> Any:
    """yaml.safe_load with libyaml when PyYAML has it (same safe loader, ~15x faster: the chart's values.yaml
    and every written manifest are read by several tests)."""
    import yaml

    return yaml.load(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_file(path: Path, name: str) -> Any:
    """A Python file of the project (a script, an e2e module) as a module named `name`, registered in sys.modules
    (dataclasses look their module up there). The scripts import only the standard library above `main`, and
    their own modules beside them (finetune.py's finetune_*.py): the file's folder is first on sys.path while it
    loads, as `python FILE` has it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def user_docs() -> str:
    """What a user reads: the README and every page of docs/, in one text (a passage may move between them)."""
    pages = [PROJECT_DIR / "README.md", *sorted((PROJECT_DIR / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def reference(*parts: str) -> Path:
    """A file under ../shared/reference, or skip: the references are read in place, never copied."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference file {path} is absent (../shared is not beside this checkout)")
    return path


def seed(name: str) -> Path:
    """A document under ../shared/seeds (what the project came from), or skip, as reference() does."""
    path = SHARED_DIR / "seeds" / name
    if not path.exists():
        pytest.skip(f"seed {path} is absent (../shared is not beside this checkout)")
    return path


def stack_path(stack: str, example: bool = True, path: Path | None = None) -> Path:
    """The example's file (tests/examples), or with example=False the project's own stack file of that name; `path`:
    a stack file elsewhere (one `make gpus WRITE=` wrote in a test's folder), run as `stack`."""
    return path or (EXAMPLES_DIR if example else PROJECT_DIR) / f"Pulumi.{stack}.yaml"


def examples() -> list[str]:
    """The example stacks the tests pin (tests/examples)."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in EXAMPLES_DIR.glob("Pulumi.*.yaml"))


def stacks() -> list[str]:
    """Every stack file of the project (Pulumi.*.yaml beside Pulumi.yaml), a user's own and edited ones included:
    what the checks every stack must pass run over (with `example=False`). Under xdist, the list the controller
    read when the run began (`pytest_configure_node`), so that a stack file added or removed while the workers
    collect (`make gpus WRITE=` in another terminal) cannot make them collect different tests."""
    if _LISTED_STACKS is not None:
        return list(_LISTED_STACKS)
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in PROJECT_DIR.glob("Pulumi.*.yaml"))


_LISTED_STACKS: list[str] | None = None
STACKS_KEY = "deepspeed_stack_stacks"


def pytest_configure(config: pytest.Config) -> None:
    """A worker takes the controller's list of stack files (xdist's workerinput); the controller reads it once."""
    global _LISTED_STACKS
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and STACKS_KEY in worker_input:
        _LISTED_STACKS = list(worker_input[STACKS_KEY])
    elif worker_input is None:
        _LISTED_STACKS = stacks()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without the plugin (pytest -p no:xdist)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[STACKS_KEY] = stacks()


_COLLECTED: dict[str, tuple[str, ...]] = {}
COLLECTION_HINT = ("hint: the two pytest-xdist workers collected different tests, so xdist stops with \"Different "
                   "tests were collected between gw0 and gw1\": a test file was added, removed or broken while they "
                   "collected (a collection error above has the same effect), or two test files share a name. Fix "
                   "any error above and run `make test` again. Stack files cannot cause it: every worker takes the "
                   "list of Pulumi.*.yaml the run started with.")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """The controller, as each worker finishes collecting: say why when their lists differ (xdist says only that)."""
    _COLLECTED[str(node.gateway.id)] = tuple(ids)
    if len(set(_COLLECTED.values())) > 1:
        reporter = node.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(COLLECTION_HINT, yellow=True)


def load_stack_config(stack: str, example: bool = True, path: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """engine.load_stack_config of the example's file (example=False: the project's; `path`: that file)."""
    from preview import engine, stackfile

    return engine.engine_config_from_yaml(stackfile.read(stack_path(stack, example, path)))


def run_stack(stack: str, overrides: dict[str, Any] | None = None, *, example: bool = True,
              path: Path | None = None) -> RunResult:
    """engine.run_stack on the example's file (example=False: the project's; `path`: that file): a fresh run,
    `overrides` replacing top-level keys (values as in the YAML)."""
    from preview import engine

    config, secret_keys = load_stack_config(stack, example, path)
    if overrides:
        extra, extra_secrets = engine.engine_config_from_yaml(overrides)
        config.update(extra)
        secret_keys = sorted(set(secret_keys) | set(extra_secrets))
    with fixed_now():
        return engine.run_program(config, secret_keys, stack=stack)


@contextlib.contextmanager
def fixed_now() -> Iterator[None]:
    """Every stack run measures from one "now" (model/reservation.py reads DEEPSPEED_STACK_NOW), the one the golden
    previews were written at, unless a test set its own: a run then gives the same plan on any day."""
    from golden_previews import NOW

    from model.reservation import NOW_ENV

    if NOW_ENV in os.environ:
        yield
        return
    os.environ[NOW_ENV] = NOW
    try:
        yield
    finally:
        os.environ.pop(NOW_ENV, None)


def stack_run(stack: str, overrides: dict[str, Any] | None = None, *, example: bool = True,
              path: Path | None = None) -> RunResult:
    """run_stack, cached by the file's text, the stack's name and the overrides, since a run is read-only for the
    tests: a project stack file still equal to its example shares the example's run."""
    text = stack_path(stack, example, path).read_text(encoding="utf-8")
    key = f"{stack} {json.dumps(overrides or {}, sort_keys=True)} {text}"
    if key not in _RUNS:
        _RUNS[key] = run_stack(stack, overrides, example=example, path=path)
    return _RUNS[key]


@pytest.fixture(scope="session")
def dev() -> RunResult:
    return stack_run("dev")


@pytest.fixture(scope="session")
def prod() -> RunResult:
    return stack_run("prod")


@pytest.fixture(scope="module")
def gaudi() -> RunResult:
    return stack_run("gaudi")


@pytest.fixture(scope="session")
def omnia() -> dict[str, Any]:
    """The newest Omnia example (Gaudi SW 1.19.1, optimum-habana v1.15.0), read in place."""
    path = reference("omnia", "examples", "ai_examples", "intel", "deepSpeed", "ds_configuration.yml")
    with open(path, encoding="utf-8") as fh:
        return yaml_load(fh)


@functools.cache
def _stack_file_config(path: Path) -> dict[str, Any]:
    """Parsed once per session (a few hundred tests change one key of the same few files); callers get copies."""
    with open(path, encoding="utf-8") as fh:
        return yaml_load(fh)["config"]


def stack_yaml(stack: str, example: bool = True, path: Path | None = None) -> dict[str, Any]:
    """An example's config (example=False: the project's stack file's; `path`: that file) as nested YAML values,
    for tests that change one key (a fresh copy each call)."""
    return copy.deepcopy(_stack_file_config(stack_path(stack, example, path)))


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def set_path(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set a key the way `pulumi config set --path` does: `nodePools[0].gpu.type` under deepspeed-stack:."""
    parts = [int(i) if i else k for k, i in _TOKEN.findall(path)]
    first = parts[0] if ":" in str(parts[0]) else f"deepspeed-stack:{parts[0]}"
    node, parts = config, [first, *parts[1:]]
    for part, nxt in itertools.pairwise(parts):
        node = node[part] if isinstance(node, list) else node.setdefault(part, [] if isinstance(nxt, int) else {})
    last = parts[-1]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return config


DELETE = object()


def changed(stack: str, changes: dict[str, Any] | None = None, example: bool = True,
            path: Path | None = None) -> dict[str, Any]:
    """A stack file's config with keys changed as `pulumi config set --path` would."""
    config = stack_yaml(stack, example, path)
    for path, value in (changes or {}).items():
        set_path(config, path, value)
    return config


def config_model(config: dict[str, Any], secure: tuple[str, ...] = ()) -> StackConfig:
    """Load a YAML-form config through the real path; `secure` names extra keys set with --secret."""
    from checks import load
    from preview import engine

    engine_cfg, secret_keys = engine.engine_config_from_yaml(config)
    return load(engine_cfg, set(secret_keys) | {f"deepspeed-stack:{k}" for k in secure})


def config_problems(config: dict[str, Any], secure: tuple[str, ...] = ()) -> list[str]:
    """The ConfigError's problems for a YAML-form config ([] when it loads)."""
    from checks import ConfigError

    try:
        config_model(config, secure)
    except ConfigError as err:
        return err.problems
    return []


def problems(stack: str, changes: dict[str, Any], secure: tuple[str, ...] = (), *, example: bool = True) -> list[str]:
    return config_problems(changed(stack, changes, example), secure)


def model(stack: str, changes: dict[str, Any] | None = None, *, example: bool = True,
          path: Path | None = None) -> StackConfig:
    return config_model(changed(stack, changes, example, path))
