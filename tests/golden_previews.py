"""Golden previews (issue 41): for every example stack (tests/examples), what the preview prints and every resource
the program registers under the SDK's mock monitor, as files in tests/golden/ that a refactor leaves byte-identical.

    make golden                     # rewrite tests/golden/ (a change that means to change the preview)
    python -m tests.golden_previews --check

Per stack: `<stack>.preview.txt` (the tree and the summary as the terminal shows them, then the program's warnings
as stderr labels them), `<stack>.summary.md` (the PR comment) and `<stack>.resources.yaml` (the stack's outputs, and
each registration by type and name: its URN, parent, options and inputs, keys sorted). Secrets are already "[secret]" in
the recording (preview/engine.py). The run fixes DEEPSPEED_STACK_NOW, the one clock the program reads. A value that
is the whole text of a project file (a script a ConfigMap carries) is shown as its length and digest: the file
itself is in the diff of the change that edits it, and a file moved unchanged leaves the golden file unchanged.

tests/test_golden.py diffs the files against a fresh render; docs/preview.md says when to regenerate them.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import yaml

PROJECT_DIR = Path(__file__).resolve().parent.parent
GOLDEN_DIR = PROJECT_DIR / "tests" / "golden"
EXAMPLES_DIR = PROJECT_DIR / "tests" / "examples"
# A fixed "now" (model/reservation.py): a reservation's remaining hours would otherwise change with the day.
NOW = "2026-11-29T00:00:00Z"
SUFFIXES = (".preview.txt", ".summary.md", ".resources.yaml")
# Folders whose files are not carried into a stack's resources (or are the golden files themselves).
_NOT_CARRIED = {".git", ".venv", "build", "tests", "e2e", "docs", "__pycache__", ".ruff_cache", ".pytest_cache"}
DIFF_LINES = 60  # the first lines of each file's diff in a failure; `make golden` and git diff show the rest


def examples() -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in EXAMPLES_DIR.glob("Pulumi.*.yaml"))


def run(stack: str) -> Any:
    """A fresh run of the example's stack file at NOW (tests reuse conftest.stack_run's cached run, also at NOW)."""
    from model.reservation import NOW_ENV
    from preview import engine, stackfile

    os.environ.setdefault(NOW_ENV, NOW)
    config, secret_keys = engine.engine_config_from_yaml(stackfile.read(EXAMPLES_DIR / f"Pulumi.{stack}.yaml"))
    return engine.run_program(config, secret_keys, stack=stack)


@functools.cache
def _project_files() -> dict[str, int]:
    """sha256 of each text file of the project that a stack may carry whole -> its number of lines."""
    found: dict[str, int] = {}
    for root, dirs, files in os.walk(PROJECT_DIR):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_CARRIED)
        for name in files:
            try:
                text = Path(root, name).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if "\n" in text.strip():
                found.setdefault(_digest(text), len(text.splitlines()))
    return found


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _value(value: Any) -> Any:
    """Keys sorted; a project file's whole text as `<file: N lines, sha256 ...>`."""
    if isinstance(value, dict):
        return {k: _value(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, str) and "\n" in value.strip() and (lines := _project_files().get(_digest(value))):
        return f"<file: {lines} lines, sha256 {_digest(value)[:16]}>"
    return value


def _short(urn: str | None) -> str | None:
    """`urn:pulumi:dev::deepspeed-stack::a$b:c::name` -> `b:c::name` (the resource's own type and name)."""
    if not urn:
        return urn
    _, _, types, name = urn.split("::", 3)
    return f"{types.rsplit('$', 1)[-1]}::{name}"


def _resource(reg: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"urn": reg.urn, "type": reg.type, "name": reg.name, "parent": _short(reg.parent),
                             "custom": reg.custom}
    if reg.provider:
        entry["provider"] = _short(reg.provider)
    if reg.dependencies:
        entry["dependencies"] = [_short(d) for d in reg.dependencies]
    options = {"protect": reg.protect, "ignoreChanges": sorted(reg.ignore_changes),
               "deleteBeforeReplace": reg.delete_before_replace, "retainOnDelete": reg.retain_on_delete,
               "customTimeouts": reg.custom_timeouts, "transforms": len(reg.transforms),
               "secretPaths": sorted(reg.secret_paths)}
    entry.update({key: value for key, value in options.items() if value})
    entry["inputs"] = _value(reg.inputs)
    return entry


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Multi-line strings as literal blocks (`|`), so a script or a config file reads as it is."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def resources_yaml(result: Any) -> str:
    doc = {"stack": result.stack, "outputs": _value(result.outputs), "warnings": list(result.warnings),
           "resources": [_resource(r) for r in sorted(result.resources, key=lambda r: (r.type, r.name, r.urn))]}
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=2**16, allow_unicode=True, default_flow_style=False)
    return (f"# tests/examples/Pulumi.{result.stack}.yaml under the mock monitor; `make golden` writes this file.\n"
            f"{body}")


def render(result: Any) -> dict[str, str]:
    """File name -> text: the three golden files of one stack's run."""
    from policy.rules import POLICIES
    from preview import policy_check, summary
    from preview.__main__ import SECTIONS, terminal_text
    from preview.sections import render_sections

    violations = policy_check.evaluate(result, {})
    extra = render_sections(result, SECTIONS)
    warnings = "".join(f"warning: {w}\n" for w in result.warnings)
    return {f"{result.stack}.preview.txt": f"{terminal_text(result, violations, None, extra)}\n{warnings}",
            f"{result.stack}.summary.md": summary.markdown(result, violations, len(POLICIES), None, extra),
            f"{result.stack}.resources.yaml": resources_yaml(result)}


def differences(files: dict[str, str], directory: Path = GOLDEN_DIR) -> list[str]:
    """A unified diff (its first DIFF_LINES lines) per file that differs from its golden copy; [] when all match."""
    found = []
    for name, text in files.items():
        path = directory / name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != text:
            diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), f"golden/{name}", "now",
                                             lineterm="", n=2))
            more = f"\n... {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
            found.append("\n".join(diff[:DIFF_LINES]) + more)
    return found


def stray(directory: Path = GOLDEN_DIR) -> list[str]:
    """Golden files of no example stack (one removed or renamed)."""
    expected = {f"{stack}{suffix}" for stack in examples() for suffix in SUFFIXES}
    return sorted(p.name for p in directory.glob("*") if p.name not in expected and p.name != "README.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden_previews", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a file differs")
    args = parser.parse_args(argv)
    failed = False
    for stack in examples():
        files = render(run(stack))
        if args.check:
            for diff in differences(files):
                print(diff)
                failed = True
            continue
        GOLDEN_DIR.mkdir(exist_ok=True)
        changed = [name for name, text in files.items()
                   if not (GOLDEN_DIR / name).exists() or (GOLDEN_DIR / name).read_text(encoding="utf-8") != text]
        for name in changed:
            (GOLDEN_DIR / name).write_text(files[name], encoding="utf-8")
        print(f"{stack}: {', '.join(changed) if changed else 'unchanged'}")
    for name in stray():
        if args.check:
            print(f"golden/{name}: no example stack of that name (tests/examples)")
            failed = True
        else:
            (GOLDEN_DIR / name).unlink()
            print(f"removed golden/{name} (no example stack of that name)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
