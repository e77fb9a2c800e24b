"""A schema error -> the problems it means, each at its key as `pulumi config set --path` spells it, and saying what
to write instead where the schema knows (a close key, the key's kind, a bucket path for a local path or a gs:// URL).
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

from model.config_read import misplaced_secret, secret_keys_of_schema, unknown_key_hint
from model.config_schema import kind_branches, schema
from model.config_validate import schema_errors
from model.problems import Problem, lines
from model.suggest import did_you_mean
from model.types import key_path
from model.workload_base import GS_SCHEME

if TYPE_CHECKING:
    import jsonschema

Found = tuple[tuple[Any, ...], Problem]  # a schema problem and the parts of its key
LOCAL_PATH_STARTS = ("/", "./", "../", "~")  # a path, not an id nor a path relative to a root the stack names


def _not_of_kind(key: str, kind: str, known: list[str]) -> str:
    """A workload key its kind does not have: a likely typo of one of its own keys, else the kind's keys (and the
    kinds that do have it)."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean `{close[0]}`?"
    branches = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])
    others = [k for k, b in branches.items() if key in b.get("properties", {})]
    where = f"; it is a key of kind {', '.join(others)}" if others else ""
    return f"not a key of kind {kind} (its keys: {', '.join(sorted(known))}){where}"


def _in_bucket(url: str) -> str:
    """What a bucket path key wants instead of `gs://BUCKET/PATH`: the path within the stack's bucket."""
    path = url[len(GS_SCHEME):].partition("/")[2].strip("/")
    instead = f": {json.dumps(path)}" if path else ""
    return f"drop the gs:// prefix and the bucket's name{instead}, a path in the stack's bucket"


def _on_claim(path: list[Any], raw: dict[str, Any] | None) -> bool:
    """Whether a path key is read on a Gaudi claim (an `mpijob` workload's `finetune` block), not in the bucket."""
    if raw is None or len(path) < 3 or path[0] != "workloads" or path[2] != "finetune":
        return False
    workload = (raw.get("workloads") or {}).get(path[1])
    return isinstance(workload, dict) and workload.get("kind", "mpijob") == "mpijob"


def _describe(error: jsonschema.ValidationError, raw: dict[str, Any] | None = None) -> list[Found]:
    """The error's problems, each with the parts of its key (what the rules must then not repeat)."""
    path = list(error.absolute_path)
    if "propertyNames" in error.relative_schema_path and isinstance(error.instance, str):
        path.append(error.instance)  # a key's name is wrong: name the key itself (`ncclTests.Bad_Name`)
    where = key_path(path)

    def found(text: str) -> list[Found]:
        return [(tuple(path) if where else (), Problem(where or "(root)", text))]

    if error.validator == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        extras = sorted(set(error.instance) - set(known))
        kind = error.schema.get("x-kind")
        describe = (lambda extra: _not_of_kind(extra, kind, known)) if kind else \
            (lambda extra: f"unknown key{unknown_key_hint(extra, known)}")
        secrets = secret_keys_of_schema()
        return [((*path, extra), misplaced_secret(path, extra) if extra in secrets else
                 Problem(key_path([*path, extra]), describe(extra))) for extra in extras]
    if error.validator == "required":
        missing = error.message.split("'")[1]
        return [((*path, missing), Problem(key_path([*path, missing]), "required key is missing"))]
    if error.validator == "type":
        return found(f"expected {error.validator_value}, got {json.dumps(error.instance)}")
    if error.validator == "enum":
        choices = ", ".join(map(str, error.validator_value))
        hint = did_you_mean(error.instance, map(str, error.validator_value)) if isinstance(error.instance, str) else ""
        return found(f"{json.dumps(error.instance)} is not one of {choices}{hint}")
    if error.validator == "pattern":
        # On a Gaudi claim the root is `storage.mountPath` (`-claim` variants), elsewhere the stack's bucket.
        claim = "-claim" if _on_claim(path, raw) and "x-local-path-claim" in error.schema else ""
        form = error.schema.get(f"x-form{claim}", error.schema.get("x-form", error.validator_value))
        local = error.schema.get(f"x-local-path{claim}")  # what to write instead of a path of the machine or pod
        if local and str(error.instance).startswith(LOCAL_PATH_STARTS):
            return found(f"{json.dumps(error.instance)} is a local path; {local} (the key takes {form})")
        if error.schema.get("x-bucket-path") and str(error.instance).startswith(GS_SCHEME):
            return found(f"{json.dumps(error.instance)} is a gs:// URL; {_in_bucket(error.instance)} ({form})")
        return found(f"{json.dumps(error.instance)} is not of the form {form}")
    if error.validator in ("minLength", "maxLength"):
        word = "at least" if error.validator == "minLength" else "at most"
        return found(f"must be {word} {error.validator_value} characters long")
    if error.validator == "uniqueItems":
        return found("lists the same value twice")
    if error.validator in ("exclusiveMinimum", "exclusiveMaximum"):
        word = "more than" if error.validator == "exclusiveMinimum" else "less than"
        return found(f"must be {word} {error.validator_value}, got {error.instance}")
    if error.validator in ("minimum", "maximum"):
        word = "at least" if error.validator == "minimum" else "at most"
        return found(f"must be {word} {error.validator_value}, got {error.instance}")
    return found(error.message)


def describe_all(errors: list[jsonschema.ValidationError], raw: dict[str, Any] | None = None) -> list[Found]:
    # dict.fromkeys: one per problem, in order; a value checked through a `$ref` and its own keywords
    # (e.g. `zones: us-west1-b`, not a list) fails the same way twice. `raw`: the config, for what depends on where
    # a key is read (a path on a Gaudi claim or in the bucket).
    return list(dict.fromkeys(found for e in errors for found in _describe(e, raw)))


def schema_problems(raw: dict[str, Any]) -> list[str]:
    """Every problem the schema finds in `raw` (defaults filled), one line each."""
    return lines(problem for _, problem in describe_all(schema_errors(raw), raw))
