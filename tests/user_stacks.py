"""The suite on a user's stacks (issue 30 item 6): `make test-user-stacks` (CI) copies the project to a temporary
folder, edits two example stacks as a user adapting them would (the Gaudi one: namespace, workers, image tag and
registry, dataset, kube context; dev: the Google Cloud project), adds two stack files of the user's own (copies of
prod and gaudi under other names, projects, namespaces and claims), and runs the whole suite there: it must pass,
and the checks every stack must pass must have run over the added files.

`make test-lone-clone` (CI): the suite in a plain copy with no ../shared beside it, as a user's own clone has it
(issue 40 item 1): every test passes or skips, none reads outside the repository.

`make examples-check` (CI): the project's stack files are still the examples the tests pin (tests/examples). In a
user's own copy an edited stack file is theirs: `make test` prints the differences as a note, never a failure.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import yaml
from conftest import SHARED_DIR  # the one place that names the folder beside the checkout

PROJECT_DIR = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = PROJECT_DIR / "tests" / "examples"
# Not copied: version control, the environment (the copy runs with this interpreter), and what runs leave behind.
LEFT_OUT = (".git", ".venv", "build", ".pytest_cache", ".ruff_cache", "__pycache__", "*.pyc")
WORKLOADS = "deepspeed-stack:workloads"
GAUDI_JOB = "gaudi-llm-ds-ft"
ADDED = ("mine", "mygaudi")  # the user's own stack files


def read(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def edit_gaudi(doc: dict[str, Any]) -> dict[str, Any]:
    """What an Omnia admin changes in the Gaudi example for their cluster."""
    config = doc["config"]
    config["deepspeed-stack:gaudiImage"].update({"registry": "harbor.corp.example/ai", "tag": "1.19.1-team2"})
    config["deepspeed-stack:kubernetes"] = {"context": "gaudi-admin@omnia"}
    job = config[WORKLOADS][GAUDI_JOB]
    job.update({"namespace": "ml-team", "workers": 2})
    job["training"]["dataset"] = "databricks/databricks-dolly-15k"
    return doc


def edit_dev(doc: dict[str, Any]) -> dict[str, Any]:
    doc["config"]["gcp:project"] = "acme-ml-123456"
    return doc


def own_gaudi(doc: dict[str, Any]) -> dict[str, Any]:
    """A second Gaudi stack of the user's: another workload, namespace and claim."""
    config = doc["config"]
    job = config[WORKLOADS].pop(GAUDI_JOB)
    job.update({"namespace": "research", "workers": 2})
    job["storage"]["claimName"] = "team-claim"
    config[WORKLOADS]["team-llm-ft"] = job
    return doc


def own_gke(doc: dict[str, Any]) -> dict[str, Any]:
    doc["config"]["gcp:project"] = "acme-research-42"
    return doc


def user_copy(dest: Path, lone: bool = False) -> None:
    """The project as a user who adapted it has it: two examples edited, two stack files added; with `lone`, the
    project as cloned, with nothing beside it."""
    shutil.copytree(PROJECT_DIR, dest, ignore=shutil.ignore_patterns(*LEFT_OUT))
    if lone:
        assert not (dest.parent / SHARED_DIR.name).exists()
        return
    if SHARED_DIR.is_dir():  # the tests read its reference copies in place (conftest.reference)
        (dest.parent / SHARED_DIR.name).symlink_to(SHARED_DIR)
    write(dest / "Pulumi.gaudi.yaml", edit_gaudi(read(dest / "Pulumi.gaudi.yaml")))
    write(dest / "Pulumi.dev.yaml", edit_dev(read(dest / "Pulumi.dev.yaml")))
    # From prod: a stack not named dev keeps its nodes private (the policy pack's gke-private-nodes).
    write(dest / "Pulumi.mine.yaml", own_gke(read(EXAMPLES_DIR / "Pulumi.prod.yaml")))
    write(dest / "Pulumi.mygaudi.yaml", own_gaudi(read(EXAMPLES_DIR / "Pulumi.gaudi.yaml")))


def outcomes(report: Path) -> tuple[list[str], list[str]]:
    """(every test id run, those that failed or errored) from pytest's JUnit XML."""
    ran, bad = [], []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        ran.append(f"{case.get('classname')}::{case.get('name')}")
        if case.find("failure") is not None or case.find("error") is not None:
            bad.append(ran[-1])
    return ran, bad


def suite_in_copy(lone: bool) -> tuple[list[str], list[str]]:
    """(tests run, tests failed) of the whole suite in a temporary copy (see user_copy)."""
    with tempfile.TemporaryDirectory(prefix="deepspeed-stack-lone-" if lone else "deepspeed-stack-user-") as tmp:
        copy = Path(tmp) / "project"
        user_copy(copy, lone)
        report = Path(tmp) / "report.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={report}"], cwd=copy, check=False)
        return outcomes(report)


def suite_on_lone_clone() -> int:
    ran, bad = suite_in_copy(lone=True)
    for test in bad:
        print(f"failed in a clone with no ../shared beside it: {test}", file=sys.stderr)
    if bad or not ran:
        return 1
    print(f"the suite passes in a clone with no ../shared beside it: {len(ran)} tests")
    return 0


def suite_on_user_stacks() -> int:
    ran, bad = suite_in_copy(lone=False)
    unchecked = [stack for stack in ADDED if not any(f"[{stack}]" in test for test in ran)]
    for test in bad:
        print(f"failed on a user's stacks: {test}", file=sys.stderr)
    for stack in unchecked:
        print(f"no per-stack check ran over the added Pulumi.{stack}.yaml", file=sys.stderr)
    if bad or unchecked or not ran:
        return 1
    print(f"the suite passes on a user's stacks: {len(ran)} tests, the per-stack checks over "
          f"{', '.join(f'Pulumi.{s}.yaml' for s in ADDED)} too")
    return 0


def examples_check(note: bool) -> int:
    """The project's stack files against the examples the tests pin; with `note`, differences are a note only."""
    differ = [p.name for p in sorted(EXAMPLES_DIR.glob("Pulumi.*.yaml"))
              if not (PROJECT_DIR / p.name).is_file() or not filecmp.cmp(p, PROJECT_DIR / p.name, shallow=False)]
    for name in differ:
        print(f"{'note: ' if note else ''}{name} differs from tests/examples/{name}, the example the tests pin: "
              "in the project, change both; in your own copy the stack file is yours (not a test failure)",
              file=sys.stderr)
    return 1 if differ and not note else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--examples-check", action="store_true", help="compare the stack files with tests/examples")
    parser.add_argument("--note", action="store_true", help="with --examples-check: report differences, exit 0")
    parser.add_argument("--lone", action="store_true", help="the suite in a plain copy with no ../shared beside it")
    args = parser.parse_args(argv)
    if args.examples_check:
        return examples_check(args.note)
    return suite_on_lone_clone() if args.lone else suite_on_user_stacks()


if __name__ == "__main__":
    sys.exit(main())
