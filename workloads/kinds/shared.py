"""Rules more than one kind uses on its own workloads (each kind lists the ones it needs)."""

from __future__ import annotations

from typing import Any

import msgspec

from model.config_schema import workload_default
from model.problems import Problem
from model.types import DeepSpeedWorkloadConfig, StackConfig, WorkloadConfig, camel
from model.validators import at, is_file
from recipes import contract
from workloads import fabric, script_flags
from workloads.ds_config import runs_hf_trainer
from workloads.mpijob import script_source
from workloads.placement import placement

SCRIPTS_DIR = contract.HERE  # recipes/
# DeepSpeed's launcher (deepspeed/launcher/launch.py) appends --local_rank=N to every rank's command line unless it
# is given --no_local_rank, which the stack passes only on a GPU fabric (workloads/fabric.py LAUNCH_FLAGS: the ranks
# start through the fabric's NCCL env script): elsewhere every script it runs must accept the flag.
LOCAL_RANK = "--local_rank"
NO_LOCAL_RANK = "--no_local_rank"
SHOWN_FLAGS = 12  # the closest flags an unknown one's message lists


def launch_script_problems(w: DeepSpeedWorkloadConfig) -> list[Problem]:
    """`launch.script` is shipped from recipes/ in a ConfigMap, unless launch.command replaces it."""
    script = w.launch.script
    if w.launch.command or ("/" not in script and is_file(SCRIPTS_DIR / script)):
        return []
    known = sorted(p.name for p in SCRIPTS_DIR.glob("*.py") if not p.name.startswith("_"))
    return [Problem(at('workloads', w.name, 'launch', 'script'), f"no file {script!r} in recipes "
            f"(there: {', '.join(known) or 'nothing'}); add it there or set launch.command")]


def launcher_flags(m: StackConfig, w: WorkloadConfig) -> dict[str, str]:
    """What DeepSpeed's launcher itself adds to every rank's arguments where the workload runs."""
    where = placement(m, w)
    on_fabric = where is not None and fabric.pod_contract(where) is not None
    if on_fabric and NO_LOCAL_RANK in fabric.LAUNCH_FLAGS:
        return {}
    return {LOCAL_RANK: "DeepSpeed's launcher (--local_rank=N)"}


def deepspeed_config_flag(m: StackConfig, w: DeepSpeedWorkloadConfig) -> dict[str, str]:
    """What the `launch` keys' command line passes besides `launch.args` (workloads/mpijob/nvidia.py launch_of,
    workloads/deepspeed_release.py): the generated ds_config.json, and DeepSpeed's --local_rank."""
    source = at("workloads", w.name, "deepspeed")
    return {"--deepspeed_config": f"the stack (the generated ds_config.json, from {source})",
            **launcher_flags(m, w)}


def script_flag_problems(w: DeepSpeedWorkloadConfig, passed: dict[str, str],
                         reported: frozenset[str] = frozenset()) -> list[Problem]:
    """The arguments `launch.script`'s own argparse parser (workloads/script_flags.py, read without running it)
    refuses at start-up, on every rank: a flag the stack or DeepSpeed passes (`passed`: flag -> who) that it does not
    define, and in `launch.args` a flag it does not have, an abbreviation several flags share, or one that repeats a
    passed flag (`reported`: flags a kind's own rule already names). Nothing when the parser cannot be read, or
    `launch.command` replaces the command line."""
    path = script_source.local_file(w.launch.script)
    flags = script_flags.read(path) if path is not None and not w.launch.command else None
    if flags is None:
        return []
    script, problems = w.launch.script, []
    for flag, who in passed.items():
        if not isinstance(flags.action_of(flag), tuple):
            problems.append(Problem(at('workloads', w.name, 'launch', 'script'),
                                    f"{script}'s parser has no {flag}, which "
                                    f"{who} passes to every rank: every rank would stop with \"unrecognized arguments: "
                                    f"{flag}\"; add it to the parser"))
    for j, token in script_flags.option_tokens(w.launch.args):
        name, key = token.split("=", 1)[0], at("workloads", w.name, "launch", "args", j)
        if name in reported:
            continue
        action = flags.action_of(token)
        if isinstance(action, str):
            problems.append(Problem(key, f"{name} is ambiguous for {script}'s parser, which would stop every rank with "
                            f"\"ambiguous option: {name} could match {action}\"; write the whole flag"))
        elif action is None:
            closest = flags.closest(token, frozenset(passed))[:SHOWN_FLAGS]
            problems.append(Problem(key, f"{script} has no flag {name} (every rank would stop with \"unrecognized "
                            f"arguments\"); its flags, closest first: {', '.join(closest) or 'none'}"))
        elif given := next((f for f in passed if f in action), None):
            what = name if name == given else f"{name} ({script}'s {given})"
            problems.append(Problem(key, f"{what} is passed to every rank already, by {passed[given]}; "
                            + ("remove it" if given == LOCAL_RANK else "change it there instead")))
    return problems


def changed_keys(value: msgspec.Struct, defaults: dict[str, Any], leave_out: tuple[str, ...] = ()) -> list[str]:
    """The keys of a block (camelCase, as the config spells them) whose value is not the schema's default: the ones
    a user set. A value equal to its default cannot be told from one never set."""
    return [camel(field) for field in value.__struct_fields__
            if camel(field) not in leave_out and getattr(value, field) != defaults.get(camel(field))]


def warn_learning_rate_unused(w: DeepSpeedWorkloadConfig) -> list[Problem]:
    """`deepspeed.learningRate` reaches a script only as the DeepSpeed-built optimizer's lr, which exists with
    optimizer offload (workloads/ds_config.py `optimizer`) and is "auto" under the Hugging Face Trainer (its own
    --learning-rate wins). Elsewhere a value of its own goes nowhere: the script's own flag sets the rate."""
    ds = w.deepspeed
    if ds.learning_rate == workload_default(w.kind, "deepspeed", "learningRate"):
        return []
    if ds.offload_optimizer != "none" and not runs_hf_trainer(w.launch.script):
        return []
    why = ("ds_config.json leaves the optimizer's lr to the Hugging Face Trainer (\"auto\"), which takes its own "
           "--learning-rate" if runs_hf_trainer(w.launch.script) else
           "ds_config.json names an optimizer only with deepspeed.offloadOptimizer, and without one the script builds "
           "its own (smoke_train.py: --lr)")
    return [Problem(at('workloads', w.name, 'deepspeed', 'learningRate'), f"{ds.learning_rate:g} is not used: {why}; "
            "pass the rate in launch.args")]
