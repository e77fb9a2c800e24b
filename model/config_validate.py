"""The schema's verdict on a config: every error jsonschema finds, in key order. A valid config's verdict is cached
across runs (model/cache.py) and each top-level value found valid is remembered in the process, so a valid stack
never imports jsonschema and a variant of one validates only the key that changed; errors are always computed afresh.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model import cache
from model.config_schema import schema

if TYPE_CHECKING:
    import jsonschema

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
    validator = schema_validator()
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


def schema_validator() -> jsonschema.protocols.Validator:
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
