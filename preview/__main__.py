"""Offline preview: run a stack under the Pulumi mock monitor and show what `pulumi up` would create.

    make preview                      # dev
    make preview STACK=prod BASE=old/plan.json

Prints the resource tree and a summary (counts, GPU inventory, workloads, policy results, changes
against BASE), and writes build/<stack>/: plan.json, manifests/, summary.md (+ the files of preview/sections/).
Exit codes: 0 ok, 1 failure or mandatory policy violation (unless --no-policy), 2 configuration error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import msgspec

from model.config import ConfigError
from model.suggest import did_you_mean
from policy.rules import POLICIES
from preview import diff, manifests, plan, policy_check, stackfile, summary, tree
from preview.engine import PROJECT_DIR, RunResult, engine_config_from_yaml, run_program, stack_file, stacks
from preview.sections import (
    Section,
    adopted,
    capacity,
    cost,
    fabric,
    pods,
    recovery,
    render_files,
    render_sections,
    serving,
    training,
    vertex,
)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2

# The summary's sections after the built-in ones, and the files written beside plan.json, in this order
# (preview/sections/): a new one is added here, nothing is found by name.
SECTIONS = (fabric.section, cost.section, capacity.section, recovery.section, vertex.section, training.section,
            serving.section, adopted.section)
FILES = (vertex.files, pods.files)


class Written(msgspec.Struct, frozen=True):
    directory: Path
    files: list[Path]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m preview", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", help="stack name: runs Pulumi.<stack>.yaml (default dev)")
    parser.add_argument("--stack-file", type=Path,
                        help="run this stack file instead of Pulumi.<stack>.yaml; needs --stack, the name the stack "
                             "runs as (it is part of every URN, and policies depend on it)")
    parser.add_argument("--base", type=Path, help="an older plan.json to diff against (e.g. the base branch's)")
    parser.add_argument("--out", type=Path, default=PROJECT_DIR / "build", help="output root (default build/)")
    parser.add_argument("--no-policy", action="store_true", help="report policy violations but exit 0")
    parser.add_argument("--policy-config", type=Path,
                        help="policy pack config JSON, as for `pulumi preview --policy-pack-config`")
    return parser.parse_args(argv)


class UsageError(Exception):
    """A wrong combination of arguments or an unusable input file: exit 2 with this message."""


def run(stack: str, path: Path) -> RunResult:
    """Run the program with the stack file's config exactly as the engine would pass it."""
    config, secret_keys = engine_config_from_yaml(stackfile.read(path))
    return run_program(config, secret_keys, stack=stack)


def stack_and_file(args: argparse.Namespace) -> tuple[str, Path]:
    """The stack name and its file. With --stack-file the name is explicit: it decides every URN (so the diff
    against a base) and the policies that apply, so it is never guessed from a file name."""
    if args.stack_file is None:
        stack = args.stack or "dev"
        path = stack_file(stack)
        if not path.exists():
            raise UsageError(f"no stack file {path.name} (stacks: {', '.join(stacks())})"
                             f"{did_you_mean(stack, stacks())}")
        return stack, path
    if not args.stack:
        named = stackfile.stack_name(args.stack_file)
        example = f" (e.g. --stack {named})" if named else ""
        raise UsageError(f"--stack-file {args.stack_file} needs --stack NAME, the stack it runs as{example}")
    if not args.stack_file.is_file():
        raise UsageError(f"--stack-file: no file {args.stack_file}")
    return args.stack, args.stack_file


def read_base(path: Path, stack: str) -> dict:
    """The base plan; refused when it is not a plan of this stack (every URN would differ: a diff of
    everything added and everything deleted says nothing)."""
    try:
        base = plan.read(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--base: cannot read {path} as a plan.json: {exc}") from None
    if not isinstance(base, dict) or not isinstance(base.get("resources"), list):
        raise UsageError(f"--base: {path} is not a plan.json of the preview (no `resources` list)")
    if base.get("stack") != stack:
        raise UsageError(f"--base: {path} is a plan of stack {base.get('stack')!r}, not of {stack!r}; give "
                         f"the base branch's build/{stack}/plan.json")
    return base


def write_build(run_result: RunResult, plan_doc: dict, summary_md: str, out_root: Path) -> Written:
    """build/<stack>/: plan.json, manifests/ (Kubernetes objects), helm/ (values and chart files), summary.md, and
    the sections' files (FILES)."""
    directory = out_root / run_result.stack
    directory.mkdir(parents=True, exist_ok=True)
    written = [plan.write(plan_doc, directory / "plan.json")]
    for folder, files in (("manifests", manifests.render(run_result)), ("helm", manifests.render_helm(run_result))):
        target_dir = directory / folder
        shutil.rmtree(target_dir, ignore_errors=True)  # recreated, so no stale file survives
        if not files and folder == "helm":
            continue
        target_dir.mkdir()
        for name, content in files.items():
            (target_dir / name).write_text(content, encoding="utf-8")
            written.append(target_dir / name)
    (directory / "summary.md").write_text(summary_md, encoding="utf-8")
    written.append(directory / "summary.md")
    for name, content in render_files(run_result, FILES).items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        written.append(target)
    return Written(directory, written)


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _wrote(written: Written) -> str:
    """`wrote build/vertex/: plan.json, summary.md, vertex-customjob.yaml, 3 file(s) in manifests/`."""
    top = [f.name for f in written.files if f.parent == written.directory]
    folders: dict[str, int] = {}
    for f in written.files:
        if f.parent != written.directory:
            folder = f.relative_to(written.directory).parts[0]
            folders[folder] = folders.get(folder, 0) + 1
    parts = [*top, *(f"{n} file(s) in {folder}/" for folder, n in folders.items())]
    return f"wrote {_display(written.directory)}/: {', '.join(parts)}"


def terminal_text(result: RunResult, violations: list[policy_check.Violation], plan_diff: diff.PlanDiff | None,
                  extra: list[Section]) -> str:
    """What the preview prints before the files it wrote: the resource tree (marked against the base plan, if
    any) and the summary. tests/golden/ holds it for every example stack."""
    changes = plan_diff.marks([r.urn for r in result.resources]) if plan_diff else None
    removed = [(r["type"], r["name"]) for r in plan_diff.removed] if plan_diff else None
    text = summary.text(result, violations, len(POLICIES), plan_diff, extra)
    return f"{tree.render(result, changes, removed)}\n\n{text}"


def preview(args: argparse.Namespace) -> int:
    try:
        stack, path = stack_and_file(args)
        base = read_base(args.base, stack) if args.base else None  # first: BASE may be this stack's last plan
        result = run(stack, path)
    except (UsageError, stackfile.StackFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    plan_doc = plan.build(result)
    violations = policy_check.evaluate(result, policy_check.load_config(args.policy_config))
    plan_diff = diff.diff(base, plan_doc) if base is not None else None
    extra = render_sections(result, SECTIONS)
    print(terminal_text(result, violations, plan_diff, extra))
    written = write_build(result, plan_doc, summary.markdown(result, violations, len(POLICIES), plan_diff, extra),
                          args.out)
    print(f"\n{_wrote(written)}")
    for warning in result.warnings:  # last, so they are what the user sees; also at the top of summary.md
        print(f"warning: {warning}", file=sys.stderr)

    mandatory = [v for v in violations if v.mandatory]
    if mandatory and not args.no_policy:
        print(f"error: {len(mandatory)} mandatory policy violation(s); fix them or pass --no-policy",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return preview(args)
    except Exception as exc:  # a short message, not a traceback, for anything unexpected
        print(f"error: preview of stack {args.stack or 'dev'!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
