"""Offline preview: run a stack under the Pulumi mock monitor and show what `pulumi up` would create.

    make preview                      # dev
    make preview STACK=prod BASE=old/plan.json

Prints the resource tree and a summary (counts, GPU inventory, workloads, policy results, changes
against BASE), and writes build/<stack>/: plan.json, manifests/, summary.md (+ files from hooks).
Exit codes: 0 ok, 1 failure or mandatory policy violation (unless --no-policy), 2 configuration error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from model.config import ConfigError
from policy.rules import POLICIES
from preview import diff, hooks, manifests, plan, policy_check, summary, tree
from preview.engine import PROJECT_DIR, RunResult, engine_config_from_yaml, run_program, stack_file, stacks

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


@dataclass(frozen=True)
class Written:
    directory: Path
    files: list[Path]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m preview", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", default="dev", help="stack name: runs Pulumi.<stack>.yaml (default dev)")
    parser.add_argument("--stack-file", type=Path, help="run this stack file instead of Pulumi.<stack>.yaml")
    parser.add_argument("--base", type=Path, help="an older plan.json to diff against (e.g. the base branch's)")
    parser.add_argument("--out", type=Path, default=PROJECT_DIR / "build", help="output root (default build/)")
    parser.add_argument("--no-policy", action="store_true", help="report policy violations but exit 0")
    parser.add_argument("--policy-config", type=Path,
                        help="policy pack config JSON, as for `pulumi preview --policy-pack-config`")
    return parser.parse_args(argv)


def run(stack: str, path: Path) -> RunResult:
    """Run the program with the stack file's config exactly as the engine would pass it."""
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    config, secret_keys = engine_config_from_yaml(doc.get("config") or {})
    return run_program(config, secret_keys, stack=stack)


def write_build(run_result: RunResult, plan_doc: dict, summary_md: str, out_root: Path) -> Written:
    """build/<stack>/: plan.json, manifests/ (recreated, so no stale object survives), summary.md, hook files."""
    directory = out_root / run_result.stack
    directory.mkdir(parents=True, exist_ok=True)
    written = [plan.write(plan_doc, directory / "plan.json")]
    manifest_dir = directory / "manifests"
    shutil.rmtree(manifest_dir, ignore_errors=True)
    manifest_dir.mkdir()
    for name, content in manifests.render(run_result).items():
        (manifest_dir / name).write_text(content, encoding="utf-8")
        written.append(manifest_dir / name)
    (directory / "summary.md").write_text(summary_md, encoding="utf-8")
    written.append(directory / "summary.md")
    for name, content in hooks.files(run_result).items():
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


def preview(args: argparse.Namespace) -> int:
    path = args.stack_file or stack_file(args.stack)
    stack = args.stack if args.stack_file is None else path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    if not path.exists():
        print(f"error: no stack file {path.name} (stacks: {', '.join(stacks())})", file=sys.stderr)
        return EXIT_CONFIG
    base = plan.read(args.base) if args.base else None  # read first: BASE may be this stack's last plan.json
    try:
        result = run(stack, path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    hooks.load()
    plan_doc = plan.build(result)
    violations = policy_check.evaluate(result, policy_check.load_config(args.policy_config))
    plan_diff = diff.diff(base, plan_doc) if base is not None else None
    extra = hooks.sections(result)

    changes = plan_diff.marks([r.urn for r in result.resources]) if plan_diff else None
    removed = [(r["type"], r["name"]) for r in plan_diff.removed] if plan_diff else None
    print(tree.render(result, changes, removed))
    print()
    print(summary.text(result, violations, len(POLICIES), plan_diff, extra))
    written = write_build(result, plan_doc, summary.markdown(result, violations, len(POLICIES), plan_diff, extra),
                          args.out)
    print(f"\nwrote {_display(written.directory)}/: plan.json, summary.md, "
          f"{sum(1 for f in written.files if f.parent.name == 'manifests')} file(s) in manifests/")

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
        print(f"error: preview of stack {args.stack!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
