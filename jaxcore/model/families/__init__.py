"""The model families jaxcore converts and runs, one module each (`llama`, `qwen2`, `qwen3`, `gpt2`, `gemma3`),
and the registry that finds a config.json's family. A new family is one module with a `Family` and one
`register_family` call (docs/porting-a-family.md); the one `Transformer` runs it."""

from __future__ import annotations

import importlib
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.model.config import ModelConfig
from jaxcore.model.families.base import Family, TensorLayout, TensorMap

__all__ = ["BUILTIN", "Family", "TensorLayout", "TensorMap", "config_from_hf", "family_named", "family_of",
           "register_family", "registered"]

BUILTIN = ("llama", "qwen2", "qwen3", "gpt2", "gemma3")
_registry: dict[str, Family] = {}


def registered() -> dict[str, Family]:
    """Every family by name: the built-in ones (imported on first use), then those registered since."""
    if not all(name in _registry for name in BUILTIN):
        for name in BUILTIN:
            _registry.setdefault(name, importlib.import_module(f"{__name__}.{name}").FAMILY)
    return _registry


def register_family(family: Family) -> Family:
    """Add (or replace) a family; its model_types must not name another family's."""
    families = registered()
    for other in families.values():
        clash = set(other.model_types) & set(family.model_types)
        if other.name != family.name and clash:
            raise ValueError(f"model_type {sorted(clash)[0]!r} is already family {other.name!r}'s")
    families[family.name] = family
    return family


def family_named(name: str) -> Family:
    """The registered family `name` (a `ModelConfig.family`)."""
    families = registered()
    if name not in families:
        raise ValueError(f"unknown family {name!r}; choose from {', '.join(families)}")
    return families[name]


def family_of(model_type: Any) -> Family:
    """The family that reads config.json's `model_type`, or a ConfigError listing the supported ones."""
    for family in registered().values():
        if model_type in family.model_types:
            return family
    supported = [t for f in registered().values() for t in f.model_types]
    raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(supported)}")


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """A ModelConfig from a parsed HF config.json, or a ConfigError naming the problem."""
    return family_of(hf.get("model_type")).parse(hf)
