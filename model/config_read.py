"""The engine's config map -> this project's keys, JSON objects decoded, and what is wrong before the schema can say:
an unknown top-level key, a secret written in plain text (or a plain key set as a secret, which the stack would
write out in plain text), `gcp:project` and `gcp:region`. Every problem is collected; nothing stops at the first.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from pulumi.runtime import config as runtime_config

from model.config_schema import schema
from model.problems import Problem
from model.types import key_path

PROJECT = "deepspeed-stack"
PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")


def engine_config() -> dict[str, Any]:
    """The config map the engine handed the program. Pulumi has no public API that lists keys, and
    listing them is what lets us catch a misspelt top-level key, so we read the runtime's map."""
    merged = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    return merged


def _decode(key: str, value: Any, prop: dict[str, Any], problems: list[Problem]) -> Any:
    if prop.get("type") in ("object", "array") and isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            problems.append(Problem(key, f"expected a {prop['type']}, got text that is not JSON ({exc.msg})"))
            return None
    return value


def unknown_key_hint(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else f"; known keys: {', '.join(sorted(options))}"


def read_raw(cfg: dict[str, Any], secret_keys: set[str], problems: list[Problem]) -> dict[str, Any]:
    """Pick this project's keys out of the engine config, decoding JSON objects and arrays."""
    props = schema()["properties"]
    raw: dict[str, Any] = {}
    prefix = f"{PROJECT}:"
    for full_key, value in cfg.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        if key not in props:
            problems.append(Problem(key, f"unknown key{unknown_key_hint(key, list(props))}"))
            continue
        if props[key].get("x-secret") and full_key not in secret_keys:
            problems.append(Problem(key, f"must be a secret, not plain text in the stack file; {secret_ways(key)}"))
        if props[key].get("x-secret") and value == "":
            problems.append(Problem(key, f"is empty; set it, or remove it with `pulumi config rm {key}`"))
        raw[key] = _decode(key, value, props[key], problems)
    return raw


def secret_keys_of_schema() -> list[str]:
    """The top-level keys that hold a secret (`x-secret`): hfToken, kubeconfig, registryPassword."""
    return [key for key, prop in schema()["properties"].items() if prop.get("x-secret")]


def secret_ways(key: str) -> str:
    """Both ways to set a secret key: the Pulumi CLI's, and the stack file's offline form, which `make preview`
    takes without the CLI (preview/engine.py reads any `{secure: ...}` value as a secret it never decrypts)."""
    example = schema()["properties"][key].get("x-secret-example", "<value>")
    return (f"set it with `pulumi config set --secret {key} {example}`, or, to preview without the Pulumi CLI, "
            f"write `{PROJECT}:{key}: {{secure: <any text>}}` under `config:` in the stack file (the preview never "
            f"reads the value; `pulumi up` needs the one `pulumi config set --secret` encrypts)")


def misplaced_secret(path: list[Any], key: str) -> Problem:
    """A top-level secret key written inside another key (`hfToken` under a workload): where it belongs."""
    where = "a workload's" if len(path) == 2 and path[0] == "workloads" else f"`{key_path(path)}`'s"
    return Problem(key_path([*path, key]), f"{key} is a top-level key of the stack (one for all its workloads), "
                   f"not {where}; {secret_ways(key)}")


def _nested_secret_keys(value: Any, path: list[Any], names: list[str]) -> list[Problem]:
    """Where a top-level secret key's name appears inside a value (its paths' messages; never the value)."""
    found: list[Problem] = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += [misplaced_secret(path, k)] if k in names else _nested_secret_keys(v, [*path, k], names)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _nested_secret_keys(v, [*path, i], names)
    return found


def plain_keys_set_as_secrets(cfg: dict[str, Any], secret_keys: set[str]) -> list[Problem]:
    """A secret anywhere in a key marks the whole key secret, but only hfToken and kubeconfig stay secret on
    their way to the cloud: any other value would land in plain text in resource inputs, plans and manifests.
    Refused before anything else, so no message ever repeats such a value. A secret key of the stack written
    inside another key (`workloads.tune.hfToken`) is told where it belongs."""
    props = schema()["properties"]
    prefix = f"{PROJECT}:"
    problems = []
    for key in sorted(secret_keys):
        name = key[len(prefix):]
        if not key.startswith(prefix) or key not in cfg or props.get(name, {}).get("x-secret"):
            continue
        misplaced = _nested_secret_keys(_json_or_none(cfg[key]), [name], secret_keys_of_schema())
        problems += misplaced or [Problem(
            name, "is set as a secret, but the stack would write it in plain text into the resources it "
            "creates; only hfToken and kubeconfig are kept secret. Set it without --secret (or, for a credential "
            "such as a proxy password, keep it out of the stack)")]
    return problems


def _json_or_none(value: Any) -> Any:
    """An engine config value as its object or list (objects arrive JSON-encoded); None for anything else."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def gcp_settings(cfg: dict[str, Any], problems: list[Problem], required: bool = True) -> tuple[str, str]:
    """`gcp:project` and `gcp:region`; required when the stack creates a GKE cluster. A stack that only
    deploys workloads to an existing cluster (e.g. Gaudi) needs no Google Cloud settings."""
    project, region = cfg.get("gcp:project"), cfg.get("gcp:region")
    if not required:
        return project or "", region or ""
    if not project:
        problems.append(Problem("gcp:project", "required; set it with `pulumi config set gcp:project <project-id>`"))
    elif not PROJECT_ID.match(project):
        problems.append(Problem("gcp:project", f"{project!r} is not a project id (6-30 lowercase letters, digits and "
                                "hyphens, starting with a letter)"))
    if not region:
        problems.append(Problem("gcp:region", "required; set it with `pulumi config set gcp:region <region>`"))
    return project or "", region or ""
