"""A user's stacks (issue 30 item 6): the tests that pin an example's values read tests/examples, the checks every
stack must pass read the project's stack files, and `make test-user-stacks` (CI) edits what a user would."""

from __future__ import annotations

from conftest import EXAMPLES_DIR, PROJECT_DIR, examples, load_file, stack_path

user_stacks = load_file(PROJECT_DIR / "tests" / "user_stacks.py", "user_stacks")


def test_the_pins_read_the_examples_and_the_per_stack_checks_the_projects_files() -> None:
    assert stack_path("gaudi") == EXAMPLES_DIR / "Pulumi.gaudi.yaml"
    assert stack_path("gaudi", example=False) == PROJECT_DIR / "Pulumi.gaudi.yaml"
    assert examples() == ["dev", "dws", "finetune", "gaudi", "h100", "prod", "serve", "vertex"]  # as shipped


def test_the_users_copy_changes_what_the_issue_names() -> None:
    # The values a user chooses that made the suite red (issue 30: 26 failures for an edited Pulumi.gaudi.yaml).
    doc = user_stacks.edit_gaudi(user_stacks.read(stack_path("gaudi")))
    job = doc["config"][user_stacks.WORKLOADS][user_stacks.GAUDI_JOB]
    example = user_stacks.read(stack_path("gaudi"))["config"]
    shipped = example[user_stacks.WORKLOADS][user_stacks.GAUDI_JOB]
    assert (job["namespace"], job["workers"], job["training"]["dataset"]) != (
        shipped["namespace"], shipped["workers"], shipped["training"]["dataset"])
    assert doc["config"]["deepspeed-stack:gaudiImage"]["tag"] != example["deepspeed-stack:gaudiImage"]["tag"]
    assert list(user_stacks.own_gaudi(user_stacks.read(stack_path("gaudi")))["config"][user_stacks.WORKLOADS]) == [
        "team-llm-ft"]
