"""Plan on a reservation (issue 31 item 1): `make gpus RESERVATION=NAME:SIZE:END` plans on its nodes, says what of
the run goes past its end and what that costs on DWS or spot, ranks by $/h or (RANK=speed) by time then $ per run,
and WRITE= names the reservation in the pool with a DWS fallback that Kueue moves the run to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import config_problems, yaml_load

from model import catalog, reservation
from planner import run_estimate
from planner.__main__ import main as planner_main
from planner.held import held_capacity, parse_reservation
from planner.model_catalog import resolve
from planner.recommend import ranked, recommend, speed_key
from planner.requests import mode_request
from preview import write_stack

PROJECT_DIR = Path(__file__).resolve().parent.parent
NOW = "2026-11-27T12:00:00Z"
SPEC = "h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z"  # 6.5 days after NOW: 156 hours
MEGA = "nvidia-h100-mega-80gb"


@pytest.fixture(autouse=True)
def fixed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reservation.NOW_ENV, NOW)


def test_a_reservation_is_a_name_a_size_and_an_end() -> None:
    res = parse_reservation(SPEC)
    assert (res.name, res.held.gpu_type, res.held.machine_type, res.held.count) == (
        "h100-res", MEGA, "a3-megagpu-8g", 2)
    assert res.end_time == "2026-12-04T00:00:00Z"  # as nodePools[].reservationEndTime takes it


@pytest.mark.parametrize(("spec", "says"), [
    ("h100-res:2xa3-megagpu-8g", "expected NAME:SIZE:END, e.g. h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z"),
    ("H100_res:2xa3-megagpu-8g:2026-12-04T00:00Z", "'H100_res' is no reservation name"),
    ("r:a3-megagpu-8g:2026-12-04T00:00Z", "a3-megagpu-8g says what but not how many; give the reservation's size"),
    ("r:2xa3-mega:2026-12-04T00:00Z", "a3-mega is neither an accelerator"),
    ("r:2xa3-megagpu-8g:2026-12-04", "the end '2026-12-04' is not an RFC 3339 time with its zone"),
    ("r:2xa3-megagpu-8g:2026-11-27T11:00Z", "it ended 2026-11-27 11:00 UTC (now 2026-11-27 12:00 UTC)"),
])
def test_what_it_refuses(spec: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSPEED_STACK_MAKE", "1")  # as make runs it: the variable the user typed
    with pytest.raises(ValueError) as err:
        parse_reservation(spec)
    assert str(err.value).startswith(f"RESERVATION={spec!r}: ") and says in str(err.value)


def test_gpus_and_reservation_must_agree() -> None:
    held, res = held_capacity("16xH100-MEGA", SPEC)
    assert res is not None and (held.gpu_type, held.count) == (MEGA, 16)  # GPUS= as given; the same two machines
    with pytest.raises(ValueError, match="name different capacity"):
        held_capacity("1xa3-megagpu-8g", SPEC)


def test_the_plan_says_what_spills_over_and_what_it_costs(capsys: pytest.CaptureFixture[str]) -> None:
    assert planner_main(["--model", "Llama-3.1-70B", "--mode", "training", "--reservation", SPEC,
                         "--tokens", "1e10"]) == 0
    out = capsys.readouterr().out
    assert "On the capacity you hold only (GPUS=2xa3-megagpu-8g): 2 x a3-megagpu-8g, all of them" in out
    assert "Ranked by $/h, cheapest first (RANK=speed ranks by time per run, then $ per run)." in out
    # By hand: 2026-11-27 12:00 to 2026-12-04 00:00 is 156 h; 2 nodes at $94.00/h on-demand: $29,328.00.
    assert ("## The reservation h100-res: 2 x a3-megagpu-8g until 2026-12-04 00:00 UTC\n  156.0 h from now "
            "(2026-11-27 12:00 UTC); paid whether its nodes work or not, about $29,328.00 at the on-demand "
            "$188.00/h.") in out
    # 1e10 tokens (the run outlives the reservation): each option's hours past the end: its run's hours less 156,
    # at $188.00/h (DWS, at most) or $75.20/h (spot).
    request = mode_request("training", resolve("Llama-3.1-70B"))
    (plan,) = [p for p in recommend(request, "us-central1", held=parse_reservation(SPEC).held) if p.options][:1]
    peak = catalog.load().gpus[MEGA].peak_tflops["bf16"]  # data/gpu_catalog.yaml
    e = run_estimate.estimate(1e10, request, plan.strategy, 16, peak, gpu_type=MEGA)
    past = (e.hours_fast - 156, e.hours_slow - 156)
    row = [line for line in out.splitlines() if line.startswith("  16 x H100 Mega 80GB ZeRO-3 + optimizer offload ")]
    dws = f"{past[0] * 188:,.2f}–{past[1] * 188:,.2f}"
    spot = f"{past[0] * 75.2:,.2f}–{past[1] * 75.2:,.2f}"
    assert len(row) == 2 and row[1].split()[-2:] == [dws, spot]  # the second: the reservation's table


def test_speed_ranks_by_time_then_cost_per_run() -> None:
    request = mode_request("training", resolve("Llama-3.1-8B"))
    cat = catalog.load()
    every = recommend(request, "us-central1", cat, top=1000)
    by_cost, by_speed = ranked(request, every, cat, "cost", 5), ranked(request, every, cat, "speed", 5)
    for cost_plan, speed_plan in zip(by_cost, by_speed, strict=True):
        if len(cost_plan.options) < 2:
            continue
        hours = [speed_key(request, speed_plan.strategy, o, cat)[0] for o in speed_plan.options]
        assert hours == sorted(hours)  # fastest first
        assert [o.on_demand for o in cost_plan.options] == sorted(o.on_demand for o in cost_plan.options)
    zero3 = next(i for i, p in enumerate(by_cost) if p.strategy.label == "ZeRO-3")
    # The cheapest per hour is not the fastest: what RANK=speed is for.
    assert by_cost[zero3].options[0].gpu_type != by_speed[zero3].options[0].gpu_type


def test_written_stack_names_the_reservation_and_falls_back_to_dws(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "Llama-3.1-70B", "--mode", "training", "--reservation", SPEC, "--rank", "speed",
            "--tokens", "1e10", "--stack", "big", "--dir", str(tmp_path)]
    assert write_stack.main(args) == 0
    capsys.readouterr()
    text = (tmp_path / "Pulumi.big.yaml").read_text(encoding="utf-8")
    flat = " ".join(line.lstrip("# ").strip() for line in text.splitlines())
    assert "RESERVATION=h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z RANK=speed WRITE=big" in flat
    assert "Ranked by time per run, then $ per run (RANK=speed)" in flat
    assert "Reservation h100-res (2 x a3-megagpu-8g) ends 2026-12-04 00:00 UTC, 156.0 h after now" in flat
    config = yaml_load(text)["config"]
    reserved, fallback = config["deepspeed-stack:nodePools"]
    assert (reserved["reservation"], reserved["reservationEndTime"], reserved["maxNodes"]) == (
        "h100-res", "2026-12-04T00:00:00Z", 2)
    assert (fallback["machineType"], fallback["gpu"], fallback["flexStart"], fallback["queuedProvisioning"]) == (
        "a3-megagpu-8g", reserved["gpu"], True, True)
    assert "reservation" not in fallback and "&id" not in text  # plain YAML, no anchors
    assert config["deepspeed-stack:kueue"] == {"install": True}
    (train,) = config["deepspeed-stack:workloads"].values()
    assert (train["pool"], train["fallbackPool"]) == (reserved["name"], fallback["name"])
    config["deepspeed-stack:hfToken"] = {"secure": "v1:planted"}  # Llama is gated: the header asks for it
    assert config_problems(config) == []


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_passes_reservation_and_rank_through() -> None:
    def dry(*variables: str) -> str:
        return subprocess.run(["make", "-n", "-s", "gpus", "MODEL=Llama-3.1-70B", "MODE=training", *variables],
                              cwd=PROJECT_DIR, capture_output=True, text=True, check=True).stdout

    for extra in ((), ("WRITE=big",)):
        out = dry(f"RESERVATION={SPEC}", "RANK=speed", *extra)
        assert f'--reservation "{SPEC}"' in out and "--rank speed" in out
