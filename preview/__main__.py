"""Offline preview: run a stack under mocks and print what it would create (`make preview STACK=dev`)."""

from __future__ import annotations

import argparse
import sys

from model.config import ConfigError
from preview.engine import RunResult, run_stack, stack_file

KEY_PROPS = ("name", "location", "machineType", "nodeLocations", "autoscaling", "tags", "repositoryId", "role")


def _summary(inputs: dict) -> str:
    flat = {**inputs, **inputs.get("nodeConfig", {})}
    return ", ".join(f"{k}={flat[k]}" for k in KEY_PROPS if k in flat)


def print_plan(run: RunResult) -> None:
    depth = {None: -1}
    for r in run.resources:
        depth[r.urn] = depth.get(r.parent, -1) + 1
        print(f"{'    ' * depth[r.urn]}+ {r.type}  {r.name}  {_summary(r.inputs)}".rstrip())
    print(f"\n{len(run.resources)} resources to create")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preview", description=__doc__)
    parser.add_argument("--stack", default="dev")
    args = parser.parse_args(argv)
    if not stack_file(args.stack).exists():
        print(f"error: no stack file {stack_file(args.stack).name}", file=sys.stderr)
        return 2
    try:
        run = run_stack(args.stack)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_plan(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
