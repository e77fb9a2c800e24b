"""The training scripts end without the interpreter's teardown (issue 32 item 7).

After destroy_process_group() DeepSpeed still references the gloo groups, whose threads then race Python's teardown
and the C++ destructors exit() runs: one `make e2e` finetune run in four aborted a finished rank there ("terminate
called without an active exception", exit -6). finetune.py and smoke_train.py end with os._exit after flushing
their output. These tests run the scripts' real `__main__` blocks in a subprocess (no torch needed on the paths
used) with an atexit handler standing for the teardown: it must not run, and the output must still arrive.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR

SCRIPTS = PROJECT_DIR / "recipes"
TEARDOWN = "TEARDOWN-RAN"


def _run_as_main(script: Path, *args: str, env: dict[str, str] | None = None,
                 preamble: str = "") -> subprocess.CompletedProcess[str]:
    """`python script args` with an atexit handler registered first: it prints only if the teardown runs."""
    # The script's folder first on sys.path, as `python script` puts it (finetune.py imports its modules from there).
    code = (preamble + "import atexit, runpy, sys\n"
            f"atexit.register(lambda: print({TEARDOWN!r}, flush=True))\n"
            f"sys.path.insert(0, {str(script.parent)!r})\n"
            f"sys.argv = [{str(script)!r}, *sys.argv[1:]]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          env=env or {"PATH": "/usr/bin:/bin"}, check=False)


def _finetune() -> Any:
    """finetune.py with its modules beside it, as the cluster imports it."""
    from workloads.finetune import script_module

    return script_module("finetune")


def test_finetune_help_reaches_a_pipe_and_the_teardown_never_runs() -> None:
    """argparse prints --help without flushing and raises SystemExit(0): the flush before os._exit delivers it."""
    done = _run_as_main(SCRIPTS / "finetune.py", "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: ")
    assert "--max-steps" in done.stdout
    assert TEARDOWN not in done.stdout


def test_finetune_usage_error_exits_2_without_teardown() -> None:
    done = _run_as_main(SCRIPTS / "finetune.py")  # no model, no dataset, no folders
    assert done.returncode == 2
    assert "[finetune] FAILED: --model (or FINETUNE_MODEL) is required" in done.stdout
    assert TEARDOWN not in done.stdout


def test_an_unknown_flag_is_argparses_exit_2() -> None:
    done = _run_as_main(SCRIPTS / "finetune.py", "--no-such-flag")
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert TEARDOWN not in done.stdout


def test_smoke_test_usage_error_exits_2_without_teardown(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1}')
    # RANK past WORLD_SIZE: refused before torch is imported.
    done = _run_as_main(SCRIPTS / "smoke_train.py", "--deepspeed_config", str(config),
                        env={"PATH": "/usr/bin:/bin", "RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"})
    assert done.returncode == 2
    assert "[smoke] FAILED: RANK=3 is not below WORLD_SIZE=2" in done.stderr
    assert TEARDOWN not in done.stdout


@pytest.mark.parametrize(("outcome", "expected"), [(0, 0), (143, 143), (2, 2)])
def test_the_status_is_the_runs(outcome: int, expected: int) -> None:
    ended: list[int] = []
    with pytest.raises(SystemExit) as stop:
        _finetune().exit_without_teardown(lambda: outcome, exit_now=ended.append)
    assert (ended, stop.value.code) == ([expected], expected)


def test_a_crash_prints_its_traceback_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    def crash() -> int:
        raise RuntimeError("NCCL error in all_reduce")

    ended: list[int] = []
    with pytest.raises(SystemExit):
        _finetune().exit_without_teardown(crash, exit_now=ended.append)
    assert ended == [1]
    assert "RuntimeError: NCCL error in all_reduce" in capsys.readouterr().err


class FakeMpi:
    """mpi4py.MPI's state calls: whether MPI was started and finalized."""

    def __init__(self, initialized: bool, finalized: bool = False) -> None:
        self.initialized, self.finalized, self.calls = initialized, finalized, 0

    def Is_initialized(self) -> bool:  # noqa: N802 (mpi4py's names)
        return self.initialized

    def Is_finalized(self) -> bool:  # noqa: N802
        return self.finalized

    def Finalize(self) -> None:  # noqa: N802
        self.calls += 1
        self.finalized = True


@pytest.mark.parametrize(("state", "calls"), [((True, False), 1), ((False, False), 0), ((True, True), 0)])
def test_mpi_is_finalized_before_the_hard_exit(monkeypatch: pytest.MonkeyPatch, state: tuple[bool, bool],
                                               calls: int) -> None:
    """DeepSpeed's OpenMPI launcher: mpirun fails a job whose rank exits without MPI_Finalize, which mpi4py would
    call at exit and os._exit skips (make e2e's mpirun scenario failed so)."""
    mpi = FakeMpi(*state)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    with pytest.raises(SystemExit):
        _finetune().exit_without_teardown(lambda: 0, exit_now=lambda code: None)
    assert mpi.calls == calls


def test_without_mpi4py_nothing_is_finalized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    with pytest.raises(SystemExit):
        _finetune().exit_without_teardown(lambda: 0, exit_now=lambda code: None)


def test_smoke_test_finalizes_mpi_before_the_hard_exit(tmp_path: Path) -> None:
    """The smoke test's own __main__ block, with an mpi4py.MPI stand-in that MPI had started."""
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1}')
    fake = ("import sys, types\n"
            "mpi = types.ModuleType('mpi4py.MPI')\n"
            "state = {'done': False}\n"
            "mpi.Is_initialized = lambda: True\n"
            "mpi.Is_finalized = lambda: state['done']\n"
            "mpi.Finalize = lambda: (state.update(done=True), print('MPI-FINALIZED', flush=True))\n"
            "sys.modules['mpi4py.MPI'] = mpi\n")
    done = _run_as_main(SCRIPTS / "smoke_train.py", "--deepspeed_config", str(config), preamble=fake,
                        env={"PATH": "/usr/bin:/bin", "RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"})
    assert done.returncode == 2
    assert done.stdout.count("MPI-FINALIZED") == 1
    assert TEARDOWN not in done.stdout
