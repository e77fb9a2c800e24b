"""A bucket in another region than the GPUs (issue 31.5): every checkpoint and read crosses regions, billed per GiB;
a labelled warning at storage.location with the rate (data/network_pricing.yaml) and each checkpoint's cost."""

from __future__ import annotations

import pytest
from conftest import model

from checks import vertex, warnings
from model import network_pricing
from model.problems import lines


def test_the_pricing_facts() -> None:
    prices = network_pricing.load()
    # Cloud Storage pricing, network data transfer within Google Cloud, between locations on one continent [U].
    assert prices.same_continent_per_gib == 0.02 and prices.different_continents_per_gib is None
    assert prices.dual_regions["NAM4"] == ("us-central1", "us-east1")  # Iowa and South Carolina
    assert prices.dual_regions["EUR4"] == ("europe-north1", "europe-west4")  # Finland and Netherlands
    assert prices.date == "2026-11-28" and "storage/pricing" in prices.source


@pytest.mark.parametrize(("location", "region", "scope", "per_gib"), [
    ("us-central1", "us-central1", "same", 0.0),
    ("US-CENTRAL1", "us-central1", "same", 0.0),  # Cloud Storage writes locations in capitals
    ("NAM4", "us-east1", "same", 0.0), ("US", "us-east4", "same", 0.0), ("EU", "europe-west4", "same", 0.0),
    ("us-east4", "us-central1", "continent", 0.02), ("northamerica-northeast1", "us-central1", "continent", 0.02),
    ("NAM4", "us-west1", "continent", 0.02), ("EU", "europe-west2", "continent", 0.02),  # London is outside the EU
    ("europe-west4", "us-central1", "intercontinental", None), ("ASIA", "us-central1", "intercontinental", None),
])
def test_what_crosses_regions(location: str, region: str, scope: str, per_gib: float | None) -> None:
    move = network_pricing.load().transfer(location, region)
    assert (move.scope, move.per_gib) == (scope, per_gib)


def test_a_bucket_in_another_region_warns_with_the_rate() -> None:
    m = model("finetune", {"storage.location": "us-east4"})
    (found,) = [w for w in warnings(m) if w.startswith("storage.location")]
    assert found == (
        "storage.location: the bucket is in us-east4 and the GPUs in us-central1, so what mounts it (workloads.chat, "
        "workloads.tune) reads and writes across regions, at $0.02 per GiB each way (Cloud Storage's data transfer "
        "between locations on one continent, data/network_pricing.yaml; an assumption until confirmed) and at "
        "inter-region bandwidth; one checkpoint costs tune's (0.65 GB) about $0.01 to write. Leave storage.location "
        "unset (the bucket then goes to us-central1) or set us-central1 (or NAM4 or US, which contain it)")


def test_a_70b_checkpoint_across_regions_is_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: a full checkpoint near 1 TB. 1,000 GB = 931.3 GiB, at $0.02: $18.63 per save."""
    monkeypatch.setattr(vertex, "stack_recovery", lambda m: {"tune": {"checkpointGb": 1000.0}})
    (found,) = lines(vertex.warn_bucket_region(model("finetune", {"storage.location": "us-east4"})))
    assert "one checkpoint costs tune's (1,000 GB) about $18.63 to write" in found


def test_across_continents_the_rate_is_named_not_guessed() -> None:
    (found,) = lines(vertex.warn_bucket_region(model("finetune", {"storage.location": "europe-west4"})))
    assert "at intercontinental rates (Europe to North America: Cloud Storage's general network table" in found
    assert "one checkpoint costs" not in found


def test_nothing_to_say_in_the_gpus_region_or_without_a_mount() -> None:
    for location in ("us-central1", "NAM4", "US"):
        assert vertex.warn_bucket_region(model("finetune", {"storage.location": location})) == []
    no_mount = model("h100", {"storage": {"enabled": True, "location": "us-east4"}})  # the smoke job mounts none
    assert [w for w in warnings(no_mount) if w.startswith("storage.location")] == []
    # The Vertex AI job reads the bucket through /gcs: it counts.
    (found,) = lines(vertex.warn_bucket_region(model("vertex", {"storage.location": "us-east4"})))
    assert "(the Vertex AI job (/gcs))" in found
