"""finetune.py's configuration: the errors it reports (naming the stack's keys where the stack started it), the
token, ds_config.json and the Trainer's arguments that must match it, and the combinations it cannot run.

Standard library only: the stack reads this module (workloads/finetune.py) to refuse at preview what the script
would refuse at start-up, and the unit tests run it without torch (tests/test_finetune_script.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The contract's variable naming the stack's key for each flag it sets (JSON: {"--records":
# "workloads.tune.finetune.recordFormat", ...}): an error about a flag's value names the key a person changes, not
# the flag the stack passed. Unset (the script run by hand): errors name the flags.
from recipes.contract import HF_TOKEN_PATH_ENV, STACK_KEYS_ENV


def say(text: str) -> None:
    """Print, surviving a closed stdout: on preemption the ssh session that carries it may be gone first."""
    with contextlib.suppress(OSError):
        print(f"[finetune] {text}", flush=True)


class UsageError(ValueError):
    """Bad arguments, environment or input files: reported in one message, exit status 2."""


class StackKeys:
    """The name to give a flag in an error: its stack key (FINETUNE_STACK_KEYS), else the flag itself."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StackKeys:
        text = environ.get(STACK_KEYS_ENV, "").strip()
        if not text:
            return cls()
        try:
            keys = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"{STACK_KEYS_ENV}: not JSON ({error})") from None
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise UsageError(f"{STACK_KEYS_ENV}: expected a JSON object of flag -> key name")
        return cls(keys)

    def of(self, flag: str) -> str:
        return self._keys.get(flag, flag)


def hf_token(environ: Mapping[str, str]) -> str | None:
    """The token in the file HF_TOKEN_PATH names (the stack mounts the Secret there), or None without one."""
    path = environ.get(HF_TOKEN_PATH_ENV, "").strip()
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise UsageError(f"{HF_TOKEN_PATH_ENV}={path}: cannot read the token file ({error.strerror})") from None
    if not token:
        raise UsageError(f"{HF_TOKEN_PATH_ENV}={path}: the token file is empty")
    return token


def cpu_run(environ: Mapping[str, str]) -> bool:
    return environ.get("DS_ACCELERATOR", "").strip().lower() == "cpu"


# --- ds_config.json and the Trainer's matching arguments --------------------------------------------------

def load_ds_config(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--deepspeed {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"--deepspeed {path}: not JSON ({error})") from None
    if not isinstance(config, dict):
        raise UsageError(f"--deepspeed {path}: expected a JSON object")
    return config


def _concrete(value: Any) -> bool:
    return value is not None and value != "auto"


def zero_stage(ds: Mapping[str, Any] | None) -> int:
    if not ds:
        return 0
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UsageError(f"ds_config.json: zero_optimization.stage must be 0-3, got {stage!r}")
    return int(stage)


def ds_precision(ds: Mapping[str, Any] | None) -> str | None:
    """The precision ds_config.json fixes: bf16/fp16 when enabled is true, None when it leaves it to the Trainer
    ("auto" or absent sections mean fp32 unless the Trainer enables one)."""
    if not ds:
        return None
    for name in ("bf16", "fp16"):
        if (ds.get(name) or {}).get("enabled") is True:
            return name
    has_auto = any((ds.get(name) or {}).get("enabled") == "auto" for name in ("bf16", "fp16"))
    return None if has_auto else "fp32"


def resolve_precision(requested: str | None, ds: Mapping[str, Any] | None) -> str:
    """--precision, or ds_config.json's; the two must agree where both say one."""
    fixed = ds_precision(ds)
    if requested and fixed and requested != fixed:
        raise UsageError(f"--precision {requested} but ds_config.json trains in {fixed}: the Trainer would refuse "
                         "to start; drop --precision or make them the same")
    return requested or fixed or "fp32"


def combination_problems(lora: bool, stage: int, precision: str, cpu: bool,
                         offload_params: bool = False) -> list[str]:
    """What this script cannot run, whatever the model: checked before anything is loaded (the stack's checks
    refuse the same combinations before anything is created)."""
    problems = []
    if cpu and precision == "fp16":
        # DeepSpeed's CPU accelerator: is_fp16_supported() is False (accelerator/cpu_accelerator.py).
        problems.append("fp16 does not run on CPUs (DeepSpeed's CPU accelerator has no fp16): use bf16 or fp32")
    if lora and offload_params and stage == 3:
        # peft wraps modules after ZeRO-3 partitioned them; with parameter offload the base weights live on the
        # host and merging the adapter at export needs them gathered twice: not supported here.
        problems.append("LoRA with ZeRO-3 parameter offload (offload_param) is not supported: offload the "
                        "optimizer only, or train without LoRA")
    return problems


def trainer_ds_args(ds: Mapping[str, Any] | None, precision: str) -> dict[str, Any]:
    """TrainingArguments that must match ds_config.json's concrete values (the Trainer refuses to start on a
    mismatch): micro batch, accumulation, clipping; and the precision."""
    out: dict[str, Any] = {"bf16": precision == "bf16", "fp16": precision == "fp16"}
    if not ds:
        return out
    pairs = (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
             ("gradient_accumulation_steps", "gradient_accumulation_steps"),
             ("gradient_clipping", "max_grad_norm"))
    for ds_key, arg in pairs:
        if _concrete(ds.get(ds_key)):
            out[arg] = ds[ds_key]
    return out


def prepared_ds_config(ds: dict[str, Any] | None) -> dict[str, Any] | None:
    """ds_config.json as the Trainer gets it: under ZeRO-3 the weights are gathered at save time, so the model
    saved at export (and each checkpoint's model files) is whole, not a shard per rank."""
    if ds is None:
        return None
    out = json.loads(json.dumps(ds))
    zero = out.get("zero_optimization") or {}
    if zero.get("stage") == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return out


def offloads_params(ds: Mapping[str, Any] | None) -> bool:
    device = ((ds or {}).get("zero_optimization") or {}).get("offload_param", {}).get("device", "none")
    return device not in (None, "none")
