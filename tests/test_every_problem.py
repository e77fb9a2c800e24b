"""Every problem at once (issue 10, item 3): a schema error no longer hides the rules' problems; the rules
run on what the schema accepted, and do not repeat what it already said."""

from __future__ import annotations

from conftest import DELETE, problems

from model import repair
from model.config import ConfigError
from model.problems import Problem
from model.types import key_path

POOL = "nodePools[0]"


def test_four_mistakes_in_one_pool_in_one_run() -> None:
    # An L4 on an N1 machine (a rule), a zone that does not exist (a rule), a negative minNodes (schema) and a
    # misspelt key (schema): all four, in one ConfigError.
    found = problems("dev", {f"{POOL}.gpu.type": "nvidia-l4", f"{POOL}.zones": ["us-west1-z"],
                             f"{POOL}.minNodes": -1, f"{POOL}.minNodez": 1})
    assert [p.split(": ", 1)[0] for p in found] == [
        f"{POOL}.minNodez", f"{POOL}.minNodes", f"{POOL}.machineType", f"{POOL}.zones[0]"]
    assert found[1] == f"{POOL}.minNodes: must be at least 0, got -1"
    assert found[3].startswith(f"{POOL}.zones[0]: us-west1-z does not offer nvidia-l4")


def test_a_rule_does_not_repeat_a_rejected_value() -> None:
    # maxNodes 0 is rejected; the pool-size rule would otherwise compare minNodes 2 with maxNodes' default.
    found = problems("dev", {f"{POOL}.maxNodes": 0, f"{POOL}.minNodes": 2})
    assert found == [f"{POOL}.maxNodes: must be at least 1, got 0"]


def test_a_rejected_list_item_drops_the_list_not_the_index() -> None:
    # zones[1] is malformed: the list goes (its default, every zone of the region, stands in), so no rule
    # names a shifted index; the pool's other mistake is still reported.
    found = problems("dev", {f"{POOL}.zones": ["us-west1-b", "west"], f"{POOL}.gpu.type": "nvidia-l4"})
    assert found == [f'{POOL}.zones[1]: "west" is not of the form a zone such as us-west1-b',
                     f"{POOL}.machineType: nvidia-l4 needs a g2 machine type, got n1-standard-8 "
                     "(g2 types that take 1 nvidia-l4: g2-standard-4, g2-standard-8, g2-standard-12, g2-standard-16)"]


def test_a_rejected_top_level_key_stops_the_rules() -> None:
    # Without nodePools the rules would see a stack without pools and blame the workload for it.
    found = problems("dev", {"nodePools": 5, "cluster.name": "Bad_Name"})
    assert found == ["nodePools: expected array, got 5"]


def test_a_missing_required_key_is_reported_with_the_rest() -> None:
    found = problems("dev", {f"{POOL}.gpu.type": DELETE, "cluster.systemPool.zones": ["us-central1-a"]})
    assert found == [f"{POOL}.gpu.type: required key is missing"]


def test_echo_rules() -> None:
    # Reported keys are parts, as the schema's errors give them; a rule's problem is a value with its key: nothing
    # is parsed back out of a line of text.
    reported = [("nodePools", 0, "maxNodes"), ("gcp:project",)]
    assert repair.is_echo(Problem("nodePools[0].maxNodes", "anything"), reported)
    assert repair.is_echo(Problem("nodePools[0].minNodes", "2 is more than maxNodes 1"), reported)
    assert repair.is_echo(Problem("storage.enabled", "the bucket needs gcp:project and gcp:region"), reported)
    assert not repair.is_echo(Problem("nodePools[1].minNodes", "2 is more than maxNodes 1"), reported)
    assert not repair.is_echo(Problem("nodePools[0].machineType", "needs a g2 machine type"), reported)


def test_a_problem_on_an_enclosing_key_echoes_only_when_it_names_the_dropped_child() -> None:
    dropped = [("workloads", "chat", "podLabels", "app")]
    assert repair.is_echo(Problem("workloads.chat", "podLabels must carry app"), dropped)
    assert not repair.is_echo(Problem("workloads.chat", "replicas must be 1"), dropped)
    # A list index names nothing, and a key with dots is one part, spelled as `pulumi config set --path` does.
    assert not repair.is_echo(Problem("nodePools", "pool 0 has no GPU"), [("nodePools", 0, "zones")])
    assert repair.is_echo(Problem('workloads["a.b"].pool', "x"), [("workloads", "a.b", "pool")])
    assert key_path(("gcp:project",)) == "gcp:project"


def test_a_problem_reads_as_the_line_users_see() -> None:
    problem = Problem("workloads.tune.finetune.saveSteps", "must be at least 1, got 0")
    assert str(problem) == "workloads.tune.finetune.saveSteps: must be at least 1, got 0"
    assert problem.level == "error"
    assert ConfigError([problem]).problems == [str(problem)]
    assert str(ConfigError([problem])) == ("invalid stack configuration (1 problem(s)):\n"
                                           "  - workloads.tune.finetune.saveSteps: must be at least 1, got 0")


# --- suggestions (item 5) ------------------------------------------------------------------------
# data/gpu_catalog.yaml (cloud.google.com/compute/docs/gpus): G2 shapes carry 1 L4 (g2-standard-4, -8, -12,
# -16, -32), 2 (g2-standard-24), 4 (-48) or 8 (-96); an N1 machine takes 1, 2 or 4 T4 up to its vCPU limits.

def test_suggestions_take_the_requested_count_smallest_first() -> None:
    (one,) = problems("dev", {f"{POOL}.gpu.type": "nvidia-l4"})
    assert one.endswith("(g2 types that take 1 nvidia-l4: g2-standard-4, g2-standard-8, g2-standard-12, "
                        "g2-standard-16)")
    (two,) = problems("dev", {f"{POOL}.gpu.type": "nvidia-l4", f"{POOL}.gpu.count": 2})
    assert two.endswith("(g2 types that take 2 nvidia-l4: g2-standard-24)")


def test_a_machine_type_that_does_not_exist_says_so() -> None:
    (found,) = problems("dev", {f"{POOL}.machineType": "n1-standard-7"})
    assert found == (f"{POOL}.machineType: n1-standard-7 is not a machine type data/gpu_catalog.yaml knows; check "
                     "its name (n1 types that take 1 nvidia-tesla-t4: n1-standard-4, n1-standard-8, n1-highmem-8, "
                     "n1-standard-16)")


def test_a_rule_that_returns_text_is_refused() -> None:
    # model/repair.py reads each problem's key from its `path`: a rule returning a line of text would leave it
    # parsing keys out of text again, so the rules' runner refuses one.
    import pytest
    from conftest import model

    import checks

    m = model("dev")
    original = list(checks.ALL_CHECKS)
    try:
        checks.ALL_CHECKS[:] = [lambda _: ["nodePools[0].minNodes: text"]]
        with pytest.raises(TypeError, match=r"rules must return model\.problems\.Problem values"):
            checks.run_all(m)
        checks.ALL_CHECKS[:] = [lambda _: [Problem("nodePools[0].minNodes", "a value")]]
        assert checks.run_all(m) == [Problem("nodePools[0].minNodes", "a value")]
    finally:
        checks.ALL_CHECKS[:] = original
