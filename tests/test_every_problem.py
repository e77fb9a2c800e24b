"""Every problem at once (issue 10, item 3): a schema error no longer hides the rules' problems; the rules
run on what the schema accepted, and do not repeat what it already said."""

from __future__ import annotations

from conftest import DELETE, problems

from model import repair
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
    reported = [key_path(["nodePools", 0, "maxNodes"]), "gcp:project"]
    assert repair.is_echo("nodePools[0].maxNodes: anything", reported)
    assert repair.is_echo("nodePools[0].minNodes: 2 is more than maxNodes 1", reported)
    assert repair.is_echo("storage.enabled: the bucket needs gcp:project and gcp:region", reported)
    assert not repair.is_echo("nodePools[1].minNodes: 2 is more than maxNodes 1", reported)
    assert not repair.is_echo("nodePools[0].machineType: needs a g2 machine type", reported)


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
