"""`make gpus` in the user's terms, for both programs behind it (`python -m planner`, `python -m preview.write_stack`).

The Makefile runs them with DEEPSPEED_STACK_MAKE=1: then an argument is named as the MAKE variable the user typed
(`BUDGET=`, `FORCE=1`), in argparse's own errors too, and the usage line is make's; run directly, as its flag
(`--budget`). Checks both programs make before planning live here too, so that their messages are the same.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn

from model import catalog as gpu_catalog

MAKE_ENV = "DEEPSPEED_STACK_MAKE"
# Each flag the Makefile's `gpus` target passes, and the variable it comes from (Makefile, target gpus).
MAKE_VARIABLES = {
    "--model": "MODEL", "--parameters": "PARAMETERS", "--mode": "MODE", "--precision": "PRECISION",
    "--region": "REGION", "--seq": "SEQ", "--batch": "BATCH", "--vocab": "VOCAB", "--hidden": "HIDDEN",
    "--largest-layer": "LARGEST", "--tokens": "TOKENS", "--data": "DATA", "--fields": "FIELDS", "--epochs": "EPOCHS",
    "--stack": "WRITE", "--budget": "BUDGET", "--force": "FORCE", "--serve": "SERVE", "--gpus": "GPUS", "--top": "TOP",
    "--reservation": "RESERVATION", "--rank": "RANK", "--runs": "RUNS",
}
SWITCHES = ("--force",)  # flags without a value: FORCE=1
MAKE_USAGE = ("make gpus MODEL=<name or Hugging Face id>|PARAMETERS=<billions> MODE=inference|training|finetune "
              "[PRECISION=..] [REGION=..] [GPUS=..] [RESERVATION=NAME:SIZE:END] [RANK=cost|speed] [TOP=..] [SEQ=..] "
              "[BATCH=..] [VOCAB=.. HIDDEN=..|LARGEST=..] "
              "[TOKENS=..|DATA=.. "
              "[FIELDS=..]] [EPOCHS=..] [WRITE=<stack> [BUDGET=<$/h>] [SERVE=0|1] [FORCE=1]]")
_FLAG = re.compile(r"--[a-z][a-z-]*")


def under_make() -> bool:
    return os.environ.get(MAKE_ENV) == "1"


def arg(flag: str, value: object = None) -> str:
    """How the user gave (or gives) an argument: `REGION=x` under make, `--region x` run directly; a switch is
    `FORCE=1` or `--force`."""
    name = MAKE_VARIABLES.get(flag) if under_make() else None
    if name is not None:
        return f"{name}=1" if flag in SWITCHES else f"{name}={'' if value is None else value}"
    return flag if value is None or flag in SWITCHES else f"{flag} {value}"


def in_user_terms(message: str) -> str:
    """A message that names flags, with each flag make sets named as its variable (`--budget` -> `BUDGET=`)."""
    if not under_make():
        return message
    return _FLAG.sub(lambda m: f"{MAKE_VARIABLES[m.group()]}=" if m.group() in MAKE_VARIABLES else m.group(), message)


class Parser(argparse.ArgumentParser):
    """argparse, but under make its errors name MAKE variables and its usage line is make's."""

    def error(self, message: str) -> NoReturn:
        if not under_make():
            super().error(message)
        sys.stderr.write(f"usage: {MAKE_USAGE}\nmake gpus: error: {in_user_terms(message)}\n")
        sys.exit(2)


def region_error(region: str, cat: gpu_catalog.Catalog) -> str | None:
    """A region the catalog does not know, with the closest one: the same words whether the plan is printed or
    written."""
    problem = cat.region_problem(region)
    return f"{arg('--region', region)} is {problem}" if problem else None
