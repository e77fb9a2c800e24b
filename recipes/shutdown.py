"""How the training programs (finetune.py, smoke_train.py) take a stop and end: SIGTERM recorded for the ranks to
agree on (StopRequest), output that survives its reader going away (ForgivingStream), and the exit without the
interpreter's teardown (exit_without_teardown), MPI finalized first.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn


class ForgivingStream:
    """stdout/stderr that survive the reader going away: on preemption the ssh session carrying a rank's output may
    close before the rank has saved its checkpoint, and a log line must not kill the save (BrokenPipeError)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StopRequest:
    """Set by SIGTERM (Kubernetes' preemption notice: the grace period has started)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signal = signum


def finalize_mpi() -> None:
    """MPI_Finalize where mpi4py started MPI (DeepSpeed's OpenMPI launcher): mpi4py calls it at exit, which
    os._exit skips, and mpirun fails a job whose rank exits without it ("exiting improperly")."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def exit_without_teardown(run: Callable[[], int], exit_now: Callable[[int], Any] = os._exit) -> NoReturn:
    """Run `run` and end the process with its status, flushing the output but skipping the interpreter's teardown.

    Why: after destroy_process_group() a rank still holds two gloo process groups, each with its TCP loop and two
    worker threads (gloo_tcp_loop, pt_gloo_runloop; seen in /proc/self/task at exit on every rank of `make e2e`'s
    finetune scenario). destroy_process_group() only unregisters them: DeepSpeed keeps them referenced (its
    groups module's _WORLD_GROUP, the engine's data_parallel_group, the ZeRO-3 optimizer's dp_process_group and
    every partitioned parameter's ds_process_group), so their threads run until the process ends, racing Python's
    teardown, the C++ destructors that exit() runs, and the peer rank closing its sockets. One run in four of that
    scenario ended a finished rank there with "terminate called without an active exception" (SIGABRT, exit -6,
    after "done at step 40" and the export): on a cluster a finished job marked failed and run again. os._exit
    ends the process without that teardown; the kernel stops the threads. Everything the run wrote is closed by
    then (checkpoints, the model, the marker), and the output is flushed here."""
    try:
        code = run()
    except SystemExit as stop:  # argparse's own usage errors
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # a crash still prints its traceback and fails the rank
        traceback.print_exc()
        code = 1
    finalize_mpi()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    exit_now(code)
    raise SystemExit(code)  # only when exit_now returned (a test's stand-in)
