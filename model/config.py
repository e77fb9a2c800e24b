"""Stack config -> one typed, validated model.

The data path: the engine's config map (`deepspeed-stack:*` and `gcp:*` keys, objects JSON-encoded)
-> schema validation with defaults (model/schema.yaml) -> typed objects (model/types.py). The semantic
rules run above this layer (checks/). Every problem found is reported at once in one `ConfigError`, a
`pulumi.RunError`, so Pulumi prints it without a traceback and no bad value reaches a cloud API.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pulumi
from pulumi.runtime import config as runtime_config

from model import cache, defaults, repair, reservation
from model.problems import Problem, lines
from model.suggest import did_you_mean
from model.types import StackConfig, build, camel, key_path, snake
from model.workload_types import GS_SCHEME, WRITTEN_KEY
from model.yamlio import load_yaml

if TYPE_CHECKING:
    import jsonschema

PROJECT = "deepspeed-stack"
Found = tuple[tuple[Any, ...], Problem]  # a schema problem and the parts of its key
SCHEMA_PATH = Path(__file__).resolve().parent / "schema.yaml"
LOCAL_PATH_STARTS = ("/", "./", "../", "~")  # a path, not an id nor a path relative to a root the stack names
PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")


class ConfigError(pulumi.RunError):
    """All configuration problems of a stack (`found`), one line each (`problems`), each starting with its key path."""

    def __init__(self, found: list[Problem]):
        self.found = found
        self.problems = lines(found)
        listed = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack configuration ({len(found)} problem(s)):\n{listed}")


@functools.cache
def schema() -> dict[str, Any]:
    return load_yaml(SCHEMA_PATH)


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


def _suggest(word: str, options: list[str]) -> str:
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
            problems.append(Problem(key, f"unknown key{_suggest(key, list(props))}"))
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


def kind_branches(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A node that dispatches on `kind` (a workload): each kind's branch (`allOf: [{if: kind is K, then: ...}]`),
    which lists every key of that kind."""
    return {b["then"]["x-kind"]: b["then"] for b in node.get("allOf", []) if "x-kind" in b.get("then", {})}


def workload_default(kind: str, *path: str) -> Any:
    """What the schema fills in for a key of a workload of this kind (`workload_default("finetune", "lora")`: the
    block with its defaults; None where the key has no default). Rules that say a key is unused compare with it:
    a value equal to its default cannot be told from one never set, so it is never called unused."""
    node = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])[kind]
    for part in path:
        node = node["properties"][part]
    return with_defaults(node, {}) if node.get("type") == "object" else copy.deepcopy(node.get("default"))


def kind_branch(node: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """The branch of `value`'s kind, or `node` itself (no dispatch, or an unknown kind: the schema says so)."""
    branches = kind_branches(node)
    chosen = value.get("kind")
    return branches.get(chosen, node) if isinstance(chosen, str) else node


def with_defaults(node: dict[str, Any], value: Any) -> Any:
    """Fill the schema's `default`s into `value` (objects recursively, array items too); a workload gets its own
    kind's defaults only."""
    if isinstance(value, dict) and node.get("type") == "object":
        node = kind_branch(node, value)
        out = dict(value)
        if isinstance(node.get("additionalProperties"), dict):  # a map, e.g. workloads: fill each entry
            out = {k: with_defaults(node["additionalProperties"], v) for k, v in out.items()}
        for name, sub in node.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(sub, out[name])
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [with_defaults(node["items"], v) for v in value]
    return value


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
            (lambda extra: f"unknown key{_suggest(extra, known)}")
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


# The validator's packages: their installed versions are part of a verdict's cache key.
VALIDATOR_PACKAGES = ("jsonschema", "jsonschema_specifications", "referencing", "rpds_py")
SECRET_SCHEMA_KEYS = {"type", "x-secret", "x-secret-example", "description"}  # none constrains the value


@functools.cache
def _validator_identity() -> bytes:
    """The schema as the program reads it and the validator's installed distributions (found without importing
    jsonschema: that import alone was ~40 ms of every run)."""
    spec = importlib.util.find_spec("jsonschema")
    site = Path(spec.origin).parent.parent if spec and spec.origin else None
    dists = sorted(n for n in (os.listdir(site) if site else []) if n.endswith(".dist-info")
                   and n.split("-", 1)[0].lower() in VALIDATOR_PACKAGES)
    return json.dumps([schema(), str(site), dists], sort_keys=True).encode()


def _verdict_key(raw: dict[str, Any]) -> str | None:
    """The cache key of the schema's verdict on `raw`. A secret enters it only as "some string", which is all the
    schema asks of one; where it asks more (or the value is no string), None: the verdict is never cached, so no
    hash of a secret is ever written."""
    props, shown = schema()["properties"], {}
    for k, v in raw.items():
        p = props.get(k, {})
        if p.get("x-secret"):
            if not isinstance(v, str) or set(p) - SECRET_SCHEMA_KEYS or p.get("type") != "string":
                return None
            v = "<a string>"
        shown[k] = v
    return cache.key(_validator_identity(), json.dumps(shown, sort_keys=True).encode())


def schema_errors(raw: dict[str, Any]) -> list[jsonschema.ValidationError]:
    """Every error the schema finds in `raw` (defaults filled), in key order. A config the same schema and
    validator passed before passes again: that verdict is cached (model/cache.py), and then jsonschema is not even
    imported. Errors are always computed afresh, once: the repair and the stand-in defaults read these same ones
    (each pass over a stack's config is ~2 ms)."""
    name = _verdict_key(raw)
    if name is not None and cache.get("schema-valid", name) is True:
        return []
    validator = _validator()
    if _each_value_valid(validator, raw):
        errors = []
    else:
        errors = sorted(validator.iter_errors(raw), key=lambda e: [str(p) for p in e.absolute_path])
    if not errors and name is not None:
        cache.put("schema-valid", name, True)
    return errors


# The root keywords under which a config is valid exactly when it has no unknown key and each key's value is valid
# under its own property's schema (no `required`, no `allOf`/`if` across keys at the root).
KEYWORDS_OF_A_PLAIN_ROOT = {"$schema", "$defs", "title", "description", "type", "properties", "additionalProperties"}
# The schema's validator and the top-level values it found valid in this process ((key, value as JSON), in memory
# only), for the schema object they were made for.
_VALIDATED: list[tuple[dict[str, Any], jsonschema.protocols.Validator, set[tuple[str, str]]]] = []


def _validator() -> jsonschema.protocols.Validator:
    """One validator per schema object: building one (its reference registry) is ~0.5 ms, a quarter of a
    validation; it keeps no state from one validation to the next."""
    current = schema()
    if not _VALIDATED or _VALIDATED[0][0] is not current:
        import jsonschema

        _VALIDATED[:] = [(current, jsonschema.Draft202012Validator(current), set())]
    return _VALIDATED[0][1]


def _each_value_valid(validator: jsonschema.protocols.Validator, raw: dict[str, Any]) -> bool:
    """Whether the schema accepts `raw`, decided key by key, each value checked once per process: configs that
    differ in one key (a stack file and its variants) are validated in that key alone. False means "not known
    valid": the caller then validates the whole config, which is what gives the errors."""
    root = validator.schema
    if set(root) - KEYWORDS_OF_A_PLAIN_ROOT or root.get("additionalProperties") is not False:
        return False
    props = root.get("properties", {})
    if any(k not in props for k in raw):
        return False
    seen = _VALIDATED[0][2] if _VALIDATED and _VALIDATED[0][1] is validator else set()
    for key, value in raw.items():
        entry = (key, json.dumps(value, sort_keys=True))
        if entry in seen:
            continue
        if not validator.evolve(schema=props[key]).is_valid(value):
            return False
        if not props[key].get("x-secret"):
            seen.add(entry)
    return True


def describe_all(errors: list[jsonschema.ValidationError], raw: dict[str, Any] | None = None) -> list[Found]:
    # dict.fromkeys: one per problem, in order; a value checked through a `$ref` and its own keywords
    # (e.g. `zones: us-west1-b`, not a list) fails the same way twice. `raw`: the config, for what depends on where
    # a key is read (a path on a Gaudi claim or in the bucket).
    return list(dict.fromkeys(found for e in errors for found in _describe(e, raw)))


def schema_problems(raw: dict[str, Any]) -> list[str]:
    """Every problem the schema finds in `raw` (defaults filled), one line each."""
    return lines(problem for _, problem in describe_all(schema_errors(raw), raw))


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


class Parsed(msgspec.Struct, frozen=True):
    """The typed model and the problems found on the way. `model` is built from the config with every value
    the schema rejected dropped (model/repair.py), so the rules can still check the rest; None when too
    much was rejected for that (a whole top-level key). `reported`: keys (their parts) whose problems the rules
    must not repeat. `variant`: the same model with the defaults of every object that had a key rejected set to other
    valid values (None when no object had one): a rule's problem that changes with them was computed from a
    default standing in for what the user meant (`zeroStag: 3` -> the default zeroStage 2 -> "at ZeRO-2 needs
    50.9 GB"), so it is left out."""

    model: StackConfig | None
    problems: list[Problem]
    reported: list[repair.Key]
    variant: StackConfig | None = None

    def rule_problems(self, problems: list[Problem], variant_problems: list[Problem] | None = None) -> list[Problem]:
        """The rules' problems that say something new and do not hang on a stand-in default (those the rules
        also find, word for word, on `variant`)."""
        if variant_problems is not None:
            same = set(variant_problems)
            problems = [p for p in problems if p in same]
        return repair.without_echoes(problems, self.reported)


def written_training(raw: dict[str, Any], filled: dict[str, Any]) -> None:
    """Record in each workload's `training` the keys the stack file wrote there (TrainingConfig.written): a rule
    refuses them beside `finetune` whatever their value, and a value equal to its default tells nothing."""
    for name, workload in (filled.get("workloads") or {}).items():
        given = ((raw.get("workloads") or {}).get(name) or {})
        training = workload.get("training") if isinstance(workload, dict) else None
        if isinstance(training, dict) and isinstance(given, dict) and isinstance(given.get("training"), dict):
            training[WRITTEN_KEY] = sorted(given["training"])


def parse_all(cfg: dict[str, Any] | None = None, secret_keys: set[str] | None = None) -> Parsed:
    """Read the stack's config into the typed model and every schema problem, without stopping at the first."""
    cfg = engine_config() if cfg is None else cfg
    if secret_keys is None:
        secret_keys = set(runtime_config._SECRET_KEYS.get()) | set(runtime_config.get_config_secret_keys_env())
    problems = plain_keys_set_as_secrets(cfg, secret_keys)
    if problems:
        return Parsed(None, problems, [])  # no message may repeat such a value, so nothing else is read
    raw = read_raw(cfg, secret_keys, problems)
    project, region = gcp_settings(cfg, problems, required="cluster" in raw)
    filled = with_defaults(schema(), raw)
    errors = schema_errors(filled)
    # The problems found so far are on top-level keys (the engine's map, gcp:*); the schema's name their parts.
    reported: list[repair.Key] = [(p.path,) for p in problems]
    for parts, problem in describe_all(errors, filled):
        problems.append(problem)
        reported.append(parts)
    valid: dict[str, Any] | None = filled
    if problems:
        fixed = repair.repair(filled, _validator(), lambda c: with_defaults(schema(), c), errors)
        valid = fixed.config
        reported += fixed.dropped
    reported = list(dict.fromkeys(reported))
    if valid is None:
        return Parsed(None, problems, reported)
    # A schema-valid config has no unknown keys, so no default stands in for one.
    unknown = defaults.objects_with_unknown_keys(errors)
    variant = defaults.other_defaults(schema(), raw, valid, unknown)
    written_training(raw, valid)
    for parts, problem in reservation.typed_end_times(valid):
        problems.append(problem)
        reported.append(parts)
    if variant is not None:
        written_training(raw, variant)
        reservation.typed_end_times(variant)  # the same problems, reported once
    secrets = {snake(k): pulumi.Output.secret(valid.pop(k)) for k, p in schema()["properties"].items()
               if p.get("x-secret") and k in valid}
    model = build(StackConfig, valid, project=project, region=region, **secrets)
    if variant is not None:
        for k in secrets:
            variant.pop(camel(k), None)
        variant = build(StackConfig, variant, project=project, region=region, **secrets)
    return Parsed(model, problems, reported, variant)


def parse(cfg: dict[str, Any] | None = None, secret_keys: set[str] | None = None) -> StackConfig:
    """Read the stack's config into the typed model, or raise ConfigError with every schema problem.

    Only what the schema and the config engine can say is checked here; the rules that need the catalog, the
    planner or the workloads live above, in checks/ (whose `load()` is what the program calls)."""
    parsed = parse_all(cfg, secret_keys)
    if parsed.problems or parsed.model is None:
        raise ConfigError(parsed.problems)
    return parsed.model
