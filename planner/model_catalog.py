"""The models the planner knows (data/models.yaml) and their shapes: a name, a Hugging Face id or a bare size
resolved to a `Model`; the Llama-like fallback shape of a model the file does not list, or the shape its user gave;
and LoRA's adapter parameters on a shape's linear layers (data/models.yaml `architectures`).

What one accelerator needs for such a model is planner/sizing.py's; this module only says what the model is.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import msgspec

from model.suggest import did_you_mean
from model.yamlio import load_yaml

MODELS_PATH = Path(__file__).resolve().parent.parent / "data" / "models.yaml"

# Shape fallback for a model not in data/models.yaml: a Llama-like decoder with head dim 128, as many layers as
# heads (hidden = 128 x layers, Llama-2-7B: 4096 = 128 x 32), parameters = 12 x layers x hidden^2, full
# multi-head attention (no grouped-query attention, so the KV cache is an upper bound) and the largest vocabulary
# in data/models.yaml (Gemma's 256000), so ZeRO-3's gathered largest layer (vocabulary x hidden, at most all the
# parameters) and the logits are upper bounds too: a Llama-2 vocabulary (32000) under-estimated Llama-3,
# Qwen and Gemma 3-6x. Give the shape (`vocabulary` and `hidden`, or `largestLayer`) for a tight estimate.
FALLBACK_HEAD_DIM = 128
FALLBACK_VOCAB = 256000
# A bare size as a model name: "7B", "1.3b", "350M".
BARE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bBmM])\s*$")
# The architecture a model without one in data/models.yaml (and the fallback shape) is taken to have.
DEFAULT_ARCHITECTURE = "llama"
ALL_LINEAR = "all-linear"  # peft's shorthand for every linear layer but the output head


class UnknownModelError(ValueError):
    """A model name that data/models.yaml does not know, with no parameter count given instead."""


class ModelShape(msgspec.Struct, frozen=True):
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int

    largest_override: int | None = None  # the largest layer's parameters, when given rather than derived
    cap: int | None = None  # the fallback's bound: no layer holds more than all the parameters
    architecture: str = DEFAULT_ARCHITECTURE  # data/models.yaml `architectures`: its linear layers

    def dimension(self, name: str) -> int:
        """A width of data/models.yaml `architectures` in this shape's numbers."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"hidden": self.hidden, "q": q, "kv": kv, "qkv": q + 2 * kv, "intermediate": self.intermediate}[name]

    @property
    def largest_layer(self) -> int:
        """Parameters of the largest single module: the embedding (or LM head) or one MLP projection."""
        if self.largest_override is not None:
            return self.largest_override
        largest = max(self.vocab * self.hidden, self.hidden * self.intermediate)
        return min(largest, self.cap) if self.cap is not None else largest


class Model(msgspec.Struct, frozen=True):
    name: str
    parameters: float  # a count, not billions
    shape: ModelShape
    shape_known: bool  # False: the fallback shape derived from the parameter count

    @property
    def billions(self) -> float:
        return self.parameters / 1e9


class Lora(msgspec.Struct, frozen=True):
    """A LoRA adapter (peft): its rank and the linear layers it targets (module names, or all-linear)."""

    rank: int
    targets: tuple[str, ...] = (ALL_LINEAR,)

    @property
    def label(self) -> str:
        return f"LoRA rank {self.rank} on {', '.join(self.targets)}"


# What people type for a Hugging Face model: its repository name without the owner (`Qwen2.5-7B-Instruct`), and that
# without the `-hf` of a converted checkpoint or a trailing version (`Llama-2-7b-chat`, `Mistral-7B-Instruct`).
_HF_SUFFIX = re.compile(r"-hf$", re.IGNORECASE)
_VERSION_SUFFIX = re.compile(r"-v\d+(\.\d+)*$", re.IGNORECASE)


def typed_forms(hub_id: str) -> list[str]:
    """The names a Hugging Face id is typed as, lowercased: `Qwen/Qwen2.5-7B-Instruct` -> `qwen2.5-7b-instruct`;
    `meta-llama/Llama-2-7b-chat-hf` -> also `llama-2-7b-chat`; `mistralai/Mistral-7B-Instruct-v0.3` -> also
    `mistral-7b-instruct`."""
    repo = hub_id.rsplit("/", 1)[-1].lower()
    unconverted = _HF_SUFFIX.sub("", repo)
    return list(dict.fromkeys([repo, unconverted, _VERSION_SUFFIX.sub("", repo), _VERSION_SUFFIX.sub("", unconverted)]))


@functools.cache
def known_models(path: Path = MODELS_PATH) -> dict[str, dict[str, Any]]:
    """data/models.yaml, keyed by lowercased name and alias, and by each alias's typed forms (`typed_forms`) where
    only one entry has that form."""
    raw = load_yaml(path)["models"]
    out: dict[str, dict[str, Any]] = {}
    typed: dict[str, set[str]] = {}
    for name, entry in raw.items():
        for key in (name, *entry.get("aliases", [])):
            out[key.lower()] = {**entry, "name": name}
        for alias in entry.get("aliases", []):
            for form in typed_forms(alias):
                typed.setdefault(form, set()).add(name)
    for form, names in typed.items():
        if len(names) == 1 and form not in out:
            (name,) = names
            out[form] = {**raw[name], "name": name}
    return out


def hub_id(typed: str | None) -> str | None:
    """The Hugging Face id a typed model name means: the id itself; the alias whose repository name it is (a
    converted `-hf` checkpoint before Meta's own format of the same name); else the newest alias it is a typed form
    of (the last listed). None for a size or a name no alias has (`Qwen2.5-7B` has its own: `Qwen/Qwen2.5-7B`):
    the writer then takes the entry's id."""
    if not typed:
        return None
    if "/" in typed:
        return typed
    entry = known_models().get(typed.lower())
    ids = [a for a in (entry or {}).get("aliases", []) if "/" in a]
    exact = [a for a in ids if a.rsplit("/", 1)[-1].lower() == typed.lower()]
    if exact:
        converted = f"{exact[0]}-hf"
        return next((a for a in ids if a.lower() == converted.lower()), exact[0])
    forms = [a for a in ids if typed.lower() in typed_forms(a)]
    return forms[-1] if forms else None


def _model_spellings() -> list[str]:
    """Every name and alias of data/models.yaml as it is written there (a misspelt Hugging Face id is matched
    against the ids)."""
    raw = load_yaml(MODELS_PATH)["models"]
    return [key for name, entry in raw.items() for key in (name, *entry.get("aliases", []))]


@functools.cache
def architectures(path: Path = MODELS_PATH) -> dict[str, tuple[tuple[str, str, str], ...]]:
    """data/models.yaml `architectures`: each family's linear layers of one decoder layer, (name, in, out)."""
    return {name: tuple((str(n), str(i), str(o)) for n, i, o in layers)
            for name, layers in load_yaml(path)["architectures"].items()}


def targeted_linears(shape: ModelShape, targets: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """The linear layers of one decoder layer LoRA adapts: all of them for all-linear, else those whose name is a
    target's last part (peft matches a module whose name ends with `.target`)."""
    layers = architectures()[shape.architecture]
    if ALL_LINEAR in targets:
        return list(layers)
    names = {t.rsplit(".", 1)[-1] for t in targets}
    return [layer for layer in layers if layer[0] in names]


def lora_parameters(shape: ModelShape, lora: Lora) -> int:
    """The adapter's parameters: rank x (in + out) per targeted linear layer, in every decoder layer."""
    per_layer = sum(lora.rank * (shape.dimension(i) + shape.dimension(o))
                    for _, i, o in targeted_linears(shape, lora.targets))
    return shape.layers * per_layer


def model_names() -> list[str]:
    return sorted({m["name"] for m in known_models().values()}, key=str.lower)


def _shape(entry: dict[str, Any]) -> ModelShape:
    return ModelShape(
        layers=int(entry["layers"]), hidden=int(entry["hidden"]), heads=int(entry["heads"]),
        kv_heads=int(entry["kvHeads"]), head_dim=int(entry.get("headDim", entry["hidden"] // entry["heads"])),
        vocab=int(entry["vocab"]), intermediate=int(entry["intermediate"]),
        architecture=str(entry.get("architecture", DEFAULT_ARCHITECTURE)),
    )


def fallback_shape(parameters: float) -> ModelShape:
    """A Llama-like shape for `parameters` (see FALLBACK_HEAD_DIM): 12 x L x h^2 = P with h = 128 x L."""
    layers = max(1, round((parameters / (12 * FALLBACK_HEAD_DIM**2)) ** (1 / 3)))
    hidden = FALLBACK_HEAD_DIM * layers
    return ModelShape(layers=layers, hidden=hidden, heads=layers, kv_heads=layers, head_dim=FALLBACK_HEAD_DIM,
                      vocab=FALLBACK_VOCAB, intermediate=math.ceil(8 * hidden / 3), cap=int(parameters))


def bare_size(name: str | None) -> float | None:
    """`7B` -> 7.0, `350M` -> 0.35 (billions); None for anything else."""
    match = BARE_SIZE.match(name or "")
    if not match:
        return None
    return float(match.group(1)) if match.group(2) in "bB" else float(match.group(1)) / 1000


def given_shape(model: Model, vocabulary: int | None = None, hidden: int | None = None,
                largest_layer_m: float | None = None) -> Model:
    """A model not in data/models.yaml with the shape its user gave: vocabulary and hidden size (the layers
    follow from the parameters, as in the fallback), or the largest layer's parameters (millions)."""
    if model.shape_known or (largest_layer_m is None and (vocabulary is None or hidden is None)):
        return model
    shape = model.shape
    if vocabulary is not None and hidden is not None:
        layers = max(1, round(model.parameters / (12 * hidden**2)))
        heads = max(1, hidden // FALLBACK_HEAD_DIM)
        shape = ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
                           vocab=vocabulary, intermediate=math.ceil(8 * hidden / 3))
    if largest_layer_m is not None:
        shape = msgspec.structs.replace(shape, largest_override=int(largest_layer_m * 1e6), cap=None)
    return msgspec.structs.replace(model, shape=shape)


def resolve(name: str | None = None, parameters_b: float | None = None) -> Model:
    """A known model name, a parameter count in billions, or both (the count overrides the known one)."""
    entry = known_models().get(name.lower()) if name else None
    if entry is None and parameters_b is None:
        parameters_b = bare_size(name)
    if entry is None and parameters_b is None:
        if not name:
            raise UnknownModelError("give a model name or a parameter count")
        raise UnknownModelError(f"unknown model {name!r}; known: {', '.join(model_names())} (or give the parameter "
                                f"count in billions){did_you_mean(name, _model_spellings())}")
    count = (parameters_b if parameters_b is not None else float(entry["parameters"])) * 1e9
    if entry is not None:
        return Model(entry["name"], count, _shape(entry), shape_known=True)
    return Model(name or f"{parameters_b:g}B", count, fallback_shape(count), shape_known=False)
