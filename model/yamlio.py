"""Read the project's YAML data files with libyaml when PyYAML has it (about 8x faster than pure Python:
the schema, the GPU catalog and the model list are read on every run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path | str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=_LOADER)
