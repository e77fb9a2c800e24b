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


# Errors about a token that was opened and never finished: YAML notices at the next line, but the mistake is where
# the token began (a key without its colon, a quote or a `[` never closed), which the error's context marks.
_UNFINISHED = ("while scanning a simple key", "while scanning a quoted scalar", "while scanning a block scalar",
               "while parsing a flow sequence", "while parsing a flow mapping", "while scanning a plain scalar")
# What the usual mistakes look like, keyed by the start of the problem libyaml or PyYAML reports.
_HINTS = {
    "could not find expected ':'": "a key without `: ` after it?",
    "mapping values are not allowed": "a value with `: ` in it needs quotes, or the line is indented too far",
    "found unexpected end of stream": "a quote that is never closed?",
    "expected ',' or ']'": "a `[` list that is never closed?",
    "did not find expected ',' or ']'": "a `[` list that is never closed?",
    "did not find expected key": "this line is indented differently from the keys above it",
    "did not find expected '-' indicator": "a list item without its `- `, or indented differently from the others",
    "expected <block end>": "this line is indented differently from the keys above it",
}


def _mistake(exc: yaml.MarkedYAMLError) -> yaml.Mark | None:
    """Where the mistake is: the start of an unfinished token, else where YAML found the problem."""
    context = exc.context or ""
    if exc.context_mark is not None and any(context.startswith(u) for u in _UNFINISHED):
        return exc.context_mark
    return exc.problem_mark or exc.context_mark


def syntax_error(path: Path, exc: yaml.YAMLError) -> str:
    """`Pulumi.dev.yaml:3: not valid YAML: could not find expected ':' (a key without `: ` after it?)` and the
    line itself, numbered as editors count."""
    mark = _mistake(exc) if isinstance(exc, yaml.MarkedYAMLError) else None
    if mark is None:
        return f"{path}: not valid YAML: {exc}"
    problem = getattr(exc, "problem", None) or str(exc)
    hint = next((h for start, h in _HINTS.items() if problem.startswith(start)), "")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    text = lines[mark.line] if 0 <= mark.line < len(lines) else ""
    if text[mark.column:mark.column + 1] == "\t":
        hint = "YAML indents with spaces, not tabs"
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    return f"{where}: not valid YAML: {problem}{f' ({hint})' if hint else ''}\n  {mark.line + 1} | {text}"


def read(path: Path) -> dict[str, Any]:
    """The stack file's `config:` mapping (empty when the file or `config:` is empty)."""
    try:
        doc = load_yaml(path)
    except yaml.YAMLError as exc:
        raise StackFileError(syntax_error(path, exc)) from None
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
