"""The driver each GPU pool gets runs the stack's image (checks/image.py check_driver, issue 32.4).

Facts (sources in data/versions.yaml and data/gke_drivers.yaml): the image is CUDA 13.0, whose oldest driver is
580.65.06 (the R580 branch; R535 and R570 run CUDA 12.x only); GKE's DEFAULT driver is R535 (seen on STABLE in
2026-02, rapidsai/deployment#656), its LATEST R580 from 1.33 (rapidsai/deployment#659) and R570 before [U].
"""

from __future__ import annotations

import msgspec
import pytest
from conftest import model, problems

import checks
from model import gke_drivers, versions
from model.yamlio import load_yaml

NEEDS = ("the stack's image is CUDA 13.0 (torch 2.13.0), which needs an R580 driver (580.65.06 or later; "
         "data/versions.yaml)")
INSUFFICIENT = 'every CUDA call would fail with "CUDA driver version is insufficient"'
GKE_STACKS = ("dev", "prod", "serve", "finetune", "dws", "h100")


# --- the facts the rule relies on ----------------------------------------------------------------------------------

def test_the_images_driver_floor() -> None:
    vs = versions.load()
    assert (vs.cuda, vs.min_driver, vs.min_driver_branch) == ("13.0", "580.65.06", 580)


def test_gkes_drivers_as_the_data_file_has_them() -> None:
    drivers = gke_drivers.load()
    rows = {r.text: (r.branches["DEFAULT"], r.branches["LATEST"], r.confirmed) for r in drivers.minors}
    assert rows == {"1.31": (535, 570, False), "1.32": (535, 570, False), "1.33": (535, 580, True),
                    "1.34": (535, 580, False), "1.35": (535, 580, False)}
    # Blackwell has no R535 driver: its DEFAULT is taken to be R570 [U].
    assert drivers.row((1, 33)).branch("DEFAULT", "nvidia-b200") == 570
    assert drivers.row((1, 33)).branch("DEFAULT", "nvidia-l4") == 535
    assert drivers.channels == {"RAPID": "1.35", "REGULAR": "1.34", "STABLE": "1.33", "EXTENDED": "1.33"}
    raw = load_yaml(gke_drivers.DATA_PATH)
    assert raw["source"] and raw["date"] == "2026-11-27"


def test_a_minor_outside_the_table_takes_its_nearest_row() -> None:
    drivers = gke_drivers.load()
    # Newer than the last row: drivers only get newer; older than the first: no newer than it.
    assert [drivers.row(minor).text for minor in ((1, 40), (1, 29), (1, 33))] == ["1.35", "1.31", "1.33"]
    assert [gke_drivers.minor_of(v) for v in ("1.32.11-gke.1174000", "1.33", "x")] == [(1, 32), (1, 33), None]


# --- refused at preview --------------------------------------------------------------------------------------------

def test_default_is_refused_at_the_pools_key() -> None:
    assert problems("dev", {"nodePools[0].gpu.driverVersion": "DEFAULT"}) == [
        "nodePools[0].gpu.driverVersion: DEFAULT installs the R535 driver on nvidia-tesla-t4 with GKE 1.34 (a new "
        "cluster's version on the REGULAR channel; data/gke_drivers.yaml, an assumption of 2026-11-27), and "
        f"{NEEDS}: {INSUFFICIENT}; use LATEST"]


def test_default_on_a_confirmed_row_says_so() -> None:
    assert problems("dev", {"nodePools[0].gpu.driverVersion": "DEFAULT", "cluster.minMasterVersion": "1.33"}) == [
        "nodePools[0].gpu.driverVersion: DEFAULT installs the R535 driver on nvidia-tesla-t4 with GKE 1.33 "
        f"(data/gke_drivers.yaml), and {NEEDS}: {INSUFFICIENT}; use LATEST"]


def test_a_gke_version_whose_latest_is_too_old_is_refused_at_the_clusters_key() -> None:
    assert problems("h100", {"cluster.minMasterVersion": "1.32"}) == [
        "cluster.minMasterVersion: GKE 1.32 (data/gke_drivers.yaml, an assumption of 2026-11-27) installs the R570 "
        f"driver as LATEST, and {NEEDS}: pool(s) h100 would run no CUDA; set cluster.minMasterVersion to 1.33 or "
        "later"]


def test_default_on_an_old_gke_names_both_fixes_once() -> None:
    # No follow-on: the pool's one problem says LATEST is not enough there either; the cluster's key stays quiet.
    assert problems("dev", {"nodePools[0].gpu.driverVersion": "DEFAULT",
                            "cluster.minMasterVersion": "1.31.6-gke.1020000"}) == [
        "nodePools[0].gpu.driverVersion: DEFAULT installs the R535 driver on nvidia-tesla-t4 with GKE 1.31 "
        f"(data/gke_drivers.yaml, an assumption of 2026-11-27), and {NEEDS}: {INSUFFICIENT}; use LATEST, and set "
        "cluster.minMasterVersion to 1.33 or later"]


def _channels(monkeypatch: pytest.MonkeyPatch, **channels: str) -> None:
    drivers = gke_drivers.load()
    older = msgspec.structs.replace(drivers, channels={**drivers.channels, **channels})
    monkeypatch.setattr(gke_drivers, "load", lambda: older)


def test_a_release_channel_on_an_old_gke_is_refused_at_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    _channels(monkeypatch, STABLE="1.32")
    assert problems("dev", {"cluster.releaseChannel": "STABLE"}) == [
        "cluster.releaseChannel: GKE 1.32 (a new cluster's version on the STABLE channel; data/gke_drivers.yaml, an "
        f"assumption of 2026-11-27) installs the R570 driver as LATEST, and {NEEDS}: pool(s) t4 would run no CUDA; "
        "set cluster.minMasterVersion to 1.33 or later"]


def test_the_floor_is_read_from_the_version_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # An image of CUDA 12 (R535 runs it) takes DEFAULT: the rule follows data/versions.yaml, not a constant.
    cuda12 = msgspec.structs.replace(versions.load(), cuda="12.2", min_driver="535.54.03")
    monkeypatch.setattr(versions, "load", lambda: cuda12)
    assert problems("dev", {"nodePools[0].gpu.driverVersion": "DEFAULT"}) == []


# --- not the image's business --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["image.prebuilt", "workloads.smoke.image"])
def test_an_image_of_the_users_own_is_not_checked(key: str) -> None:
    # A prebuilt image's CUDA is unknown; a pool that only runs a workload's own image is that image's business.
    assert problems("dev", {"nodePools[0].gpu.driverVersion": "DEFAULT",
                            key: "us-docker.pkg.dev/p/r/deepspeed@sha256:" + "a" * 64}) == []


def test_installation_disabled_is_a_warning() -> None:
    changes = {"nodePools[0].gpu.driverVersion": "INSTALLATION_DISABLED"}
    assert problems("dev", changes) == []
    assert [w for w in checks.warnings(model("dev", changes)) if "driverVersion" in w] == [
        f"nodePools[0].gpu.driverVersion: INSTALLATION_DISABLED installs no driver, and {NEEDS}: install one "
        "yourself (a driver installer DaemonSet pinned to such a version) before the pool's pods start, or use "
        "LATEST"]


@pytest.mark.parametrize("stack", GKE_STACKS)
def test_every_example_stacks_pools_get_a_driver_the_image_runs_on(stack: str) -> None:
    m = model(stack)
    assert {p.gpu.driver_version for p in m.node_pools} == {"LATEST"}
    assert checks.image.check_driver(m) == []
    assert not [w for w in checks.warnings(m) if "driverVersion" in w]
