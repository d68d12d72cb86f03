"""Dataclass configs: YAML loading and dotted `key=value` overrides, with one-line errors.

    cfg = load_config(ESConfig, "configs/countdown.yaml", ["es.sigma=1e-3", "train.epochs=20"])

An unknown key or a value of the wrong type raises `ConfigValueError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from jaxcore.errors import ConfigValueError  # noqa: F401  (re-exported)

T = TypeVar("T")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, key: str, default: Any = None) -> Any:
    """Check (and gently convert) `value` against a type annotation; a mapping for a dataclass section
    overrides `default` (the section the config already has) field by field."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        sections = [a for a in args if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(sections) == 1:     # an optional section: its own error says more
            return _coerce(value, sections[0], key, default)
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, key, default)
            except ConfigValueError as err:
                errors.append(str(err))
        raise ConfigValueError(f"{key}: {value!r} does not match {annotation}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigValueError(f"{key}: expected a mapping, got {type(value).__name__}")
        return from_dict(annotation, value, prefix=f"{key}.", base=default if isinstance(default, annotation) else None)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigValueError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item = args[0] if args else Any
        coerced = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(coerced) if origin is tuple else coerced
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigValueError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigValueError(f"{key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigValueError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):          # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigValueError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigValueError(f"{key}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys and wrong types. Keys not given keep
    `base`'s values when given, else the defaults the enclosing config gives its sections (a GRPO job's
    `optimizer` starts from TRL's AdamW settings, not from `OptimizerConfig()`'s)."""
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigValueError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(types_))})")
    fields = {f.name: f for f in dataclasses.fields(cls)}

    def current(name: str) -> Any:
        """The value a given key overrides: the base section's, else the field's default."""
        return getattr(base, name) if base is not None else _default(fields[name])

    values = {name: _coerce(value, types_[name], f"{prefix}{name}", current(name)) for name, value in data.items()}
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except (TypeError, ValueError) as err:
        message = str(err)
        field = re.match(r"(\w+)\b", message)
        if prefix and field and field.group(1) in types_:       # "export=zip: ..." -> "grpo.lora.export=zip: ..."
            raise ConfigValueError(f"{prefix}{message}") from err
        raise ConfigValueError(f"{prefix.rstrip('.') or cls.__name__}: {message}") from err


def _default(field: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory), or None when it has none."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (YAML/JSON serialisable) of a dataclass config."""
    return dataclasses.asdict(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'es.sigma=1e-3' -> (['es', 'sigma'], 0.001); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigValueError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigValueError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigValueError(f"override {key}: cannot parse {raw!r}") from err
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (missing intermediate mappings are created)."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigValueError(f"override {'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigValueError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigValueError(f"{path}:{where} invalid YAML") from err
    if not isinstance(data, dict):
        raise ConfigValueError(f"{path}: the top level must be a mapping")
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Defaults of `cls`, then the YAML file, then the dotted overrides."""
    data = read_yaml(path) if path else {}
    return from_dict(cls, apply_overrides(data, overrides))
