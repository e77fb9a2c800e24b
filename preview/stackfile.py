"""Read a stack file (Pulumi.<stack>.yaml) the way the Pulumi CLI would, with errors that name the file.

A stack file is a mapping with a `config:` mapping and a few settings of the CLI's own; anything else
(a misspelt `config:`, `config: 5`, a YAML syntax error) would otherwise preview nothing, or fail with a
traceback, so each is a `StackFileError` naming the file and the problem.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from model.yamlio import load_yaml

# The top-level keys of a stack settings file (Pulumi's "Project and stack settings file reference":
# https://www.pulumi.com/docs/iac/concepts/projects/stack-settings-file/).
STACK_FILE_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")
# Config namespaces this program or its providers read; a namespace close to one of them is a typo.
KNOWN_NAMESPACES = ("deepspeed-stack", "gcp", "kubernetes", "pulumi", "docker-build")


class StackFileError(ValueError):
    """A stack file that is not a valid stack settings file; the message names the file."""


def stack_name(path: Path) -> str:
    """`Pulumi.prod.yaml` -> `prod` (the CLI's naming); '' for a file not named that way."""
    name = path.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")) and name.count(".") >= 2:
        return name[len("Pulumi."):].rsplit(".", 1)[0]
    return ""


def _suggest(word: str, options: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else f"known: {', '.join(options)}"


def _namespace_problems(config: dict[str, Any]) -> list[str]:
    problems = []
    for key in config:
        namespace = str(key).split(":", 1)[0] if ":" in str(key) else ""
        if not namespace or namespace in KNOWN_NAMESPACES:
            continue
        close = difflib.get_close_matches(namespace, KNOWN_NAMESPACES, n=1, cutoff=0.75)
        if close:
            problems.append(f"config: {key}: unknown namespace `{namespace}`; did you mean `{close[0]}:`?")
    return problems


def read(path: Path) -> dict[str, Any]:
    """The stack file's `config:` mapping (empty when the file or `config:` is empty)."""
    try:
        doc = load_yaml(path)
    except yaml.YAMLError as exc:
        raise StackFileError(f"{path}: not valid YAML: {exc}") from None
    except OSError as exc:
        raise StackFileError(f"{path}: cannot be read: {exc.strerror}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise StackFileError(f"{path}: expected a mapping with a `config:` key, got {type(doc).__name__} {doc!r}")
    problems = [f"{key}: unknown top-level key; {_suggest(str(key), STACK_FILE_KEYS)}"
                for key in doc if key not in STACK_FILE_KEYS]
    config = doc.get("config")
    if config is not None and not isinstance(config, dict):
        problems.append(f"config: expected a mapping of keys to values (e.g. `gcp:region: us-central1`), "
                        f"got {type(config).__name__} {config!r}")
    elif config:
        problems += _namespace_problems(config)
    if problems:
        raise StackFileError(f"{path}: not a valid stack file:\n" + "\n".join(f"  - {p}" for p in problems))
    return config or {}
