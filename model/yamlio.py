"""Read the project's YAML data files and stack files with libyaml when PyYAML has it (about 8x faster than pure
Python: the schema, the GPU catalog and the model list are read on every run).

A key given twice in one mapping is an error naming the key and both lines. PyYAML would keep the last value
silently; the Pulumi CLI (Go yaml.v3) refuses such a stack file ("mapping key ... already defined at line N"),
so a stack that previews here must not be one `pulumi up` rejects.

What a file parses to is cached (model/cache.py, kind `yaml`) under the SHA-256 of its bytes, of this module's
source and of PyYAML's version: the cache cannot answer for other bytes or another loader, so it is never stale.
Building the Python objects is PyYAML's pure-Python part even with libyaml, and the schema, the catalog and the
other data files took ~50 ms of every run's start; a cached file loads in well under a millisecond.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from model import cache

_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A mapping names the same key twice; `key`, `first_line` and `line` are 1-based as editors count."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        self.key, self.first_line, self.line = key, first.line + 1, again.line + 1
        super().__init__(None, None, f"duplicate key `{key}` at line {self.line} (first given at line "
                                     f"{self.first_line}); keep one of the two", again)


class _Loader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicates(self, node)
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicates(loader: Any, node: yaml.MappingNode) -> None:
    """Explicit keys only: what a `<<` merge brings in may be overridden, as YAML's merge key intends."""
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise DuplicateKeyError(key, seen[key], key_node.start_mark)
        seen[key] = key_node.start_mark


@functools.cache
def _loader_identity() -> bytes:
    """What else decides the result for given bytes: this module (the loader's rules) and PyYAML."""
    return Path(__file__).read_bytes() + f"|{yaml.__version__}|{_BASE_LOADER.__name__}".encode()


def load_yaml(path: Path | str) -> Any:
    data = Path(path).read_bytes()
    name = cache.key(_loader_identity(), data)
    value = cache.get("yaml", name)
    if value is cache.MISS:
        # Parsed from the bytes that were hashed, as a named stream, so errors name the file as before.
        stream = io.StringIO(data.decode("utf-8"), newline=None)
        stream.name = str(path)
        value = yaml.load(stream, Loader=_Loader)
        cache.put("yaml", name, value)
    return value


def loads_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)
