"""A Hugging Face token (`hfToken`) never blocks a stack: every example stack passes the policy pack with and
without it (issue 19.1). The token reaches pods as a mounted file that HF_TOKEN_PATH names; the policy
`no-plaintext-secret-env` must tell that path from a literal secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import stack_run, stacks
from test_policy import LAUNCHER, MPIJOB, RELEASE, changed, check

from preview import policy_check
from preview.engine import RunResult

TOKEN = {"secure": "v1:planted-ciphertext"}  # what `pulumi config set --secret hfToken hf_...` writes


@pytest.mark.parametrize("stack", stacks())
def test_every_stack_passes_the_policy_pack_with_a_token(stack: str) -> None:
    """Without a token: test_policy.test_repo_stacks_have_no_mandatory_violation. With one, the Secret and the
    path that names it are in every pod that downloads a model, and still nothing is mandatory."""
    passes_with_a_token(stack)


def passes_with_a_token(stack: str, path: Path | None = None) -> None:
    run = stack_run(stack, {"hfToken": TOKEN}, example=False, path=path)
    assert [(v.policy, v.message) for v in policy_check.evaluate(run) if v.mandatory] == []


def test_a_path_to_a_secret_is_not_a_secret(dev: RunResult) -> None:
    release = dev.one(RELEASE)
    # huggingface_hub's HF_TOKEN_PATH: the file a Secret is mounted at.
    path_env = [{"name": "HF_TOKEN_PATH", "value": "/etc/huggingface/token"}]
    assert check("no-plaintext-secret-env", changed(release, "values.worker.extraEnvVars", path_env)) == []
    assert check("no-plaintext-secret-env",
                 changed(release, "values.worker.extraEnvVars", [{"name": "API_KEY_FILE", "value": "/run/k"}])) == []


@pytest.mark.parametrize("entry", [
    {"name": "HF_TOKEN_PATH", "value": "hf_abcdefghijklmnop"},  # named like a path, holds the token
    {"name": "HF_TOKEN", "value": "/etc/huggingface/token"},  # named like the token: whatever it holds is one
    {"name": "DB_PASSWORD_FILE", "value": "hunter2"},
    {"name": "HF_TOKEN_PATH", "value": "/etc/hf token"},  # no path has a space in our mounts; a pasted phrase
])
def test_a_literal_secret_is_still_flagged(gaudi: RunResult, entry: dict[str, str]) -> None:
    job = gaudi.one(MPIJOB)
    env = [*job.inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["env"], entry]
    (msg,) = check("no-plaintext-secret-env", changed(job, f"{LAUNCHER}.env", env))
    assert msg.startswith(f"{LAUNCHER}.env[{len(env) - 1}] sets {entry['name']} to a literal value")
