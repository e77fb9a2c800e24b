"""Rules more than one kind uses on its own workloads (each kind lists the ones it needs)."""

from __future__ import annotations

from pathlib import Path

from model.types import DeepSpeedWorkloadConfig
from model.validators import at, is_file

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"


def launch_script_problems(w: DeepSpeedWorkloadConfig) -> list[str]:
    """`launch.script` is shipped from workloads/scripts in a ConfigMap, unless launch.command replaces it."""
    script = w.launch.script
    if w.launch.command or ("/" not in script and is_file(SCRIPTS_DIR / script)):
        return []
    known = sorted(p.name for p in SCRIPTS_DIR.glob("*.py"))
    return [f"{at('workloads', w.name, 'launch', 'script')}: no file {script!r} in workloads/scripts "
            f"(there: {', '.join(known) or 'nothing'}); add it there or set launch.command"]
