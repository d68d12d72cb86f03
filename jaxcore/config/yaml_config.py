"""Dataclass configs: YAML loading and dotted `key=value` overrides, with one-line errors.

    cfg = load_config(ESConfig, "configs/countdown.yaml", ["es.sigma=1e-3", "train.epochs=20"])

An unknown key, or a value of the wrong type or outside the range its field declares (`schema`), raises
`ConfigValueError` naming the dotted key, the value and what is allowed.
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

from jaxcore.config import schema
from jaxcore.errors import ConfigValueError, UserError, read_text

T = TypeVar("T")


def _section_value(value: Any, hint: Any, key: str, default: Any = None) -> Any:
    """A mapping for a dataclass section (or an optional one) builds it, overriding `default` (the section the
    config already has) field by field (an empty one, YAML's null, keeps it); any other value is checked against
    its declaration (`schema`)."""
    section = schema.section_type(hint)
    if value is None and section is hint:
        value = {}
    if section is not None and isinstance(value, dict):
        return from_dict(section, value, prefix=f"{key}.", base=default if isinstance(default, section) else None)
    return schema.value_of(hint, value, key, from_text=True)


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys and wrong types. Keys not given keep
    `base`'s values when given, else the defaults the enclosing config gives its sections (a GRPO job's
    `optimizer` starts from TRL's AdamW settings, not from `OptimizerConfig()`'s)."""
    types_ = schema.field_hints(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigValueError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(types_))})")
    fields = {f.name: f for f in dataclasses.fields(cls)}

    def current(name: str) -> Any:
        """The value a given key overrides: the base section's, else the field's default."""
        return getattr(base, name) if base is not None else _default(fields[name])

    values = {name: _section_value(value, types_[name], f"{prefix}{name}", current(name))
              for name, value in data.items()}
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


def parse_override(text: str, cls: type | None = None) -> tuple[list[str], Any]:
    """'es.sigma=1e-3' -> (['es', 'sigma'], 0.001): the value is parsed as YAML, except where the key is a text
    field of `cls` (a path, a prompt), which takes it as typed: 'rollout.system_prompt=Be brief. #1' keeps its
    ' #1' and a newline stays a newline (YAML would read a comment and fold the line)."""
    if "=" not in text:
        raise ConfigValueError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigValueError(f"override {text!r} has an empty key")
    path = key.split(".")
    hint = _field_hint(cls, path) if cls is not None else None
    if is_text_field(hint):
        return path, None if raw in YAML_NULLS and _allows_none(hint) else raw
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigValueError(f"override {key}: cannot parse {raw!r}") from err
    return path, value


def _field_hint(cls: type, path: list[str]) -> Any:
    """The declaration of the field a dotted path names in `cls`, or None when it names none."""
    hint: Any = cls
    for part in path:
        section = schema.section_type(hint)
        if section is None:
            return None
        hint = schema.field_hints(section).get(part)
    return hint


YAML_NULLS = ("null", "Null", "NULL", "~")


def _bare(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _allows_none(hint: Any) -> bool:
    return type(None) in typing.get_args(_bare(hint))


def is_text_field(hint: Any) -> bool:
    """A field that holds free text: `str` or `str | None`, with or without constraints (not a Literal)."""
    hint = _bare(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint)) == {str, type(None)}
    return hint is str


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], cls: type | None = None) -> dict[str, Any]:
    """Set dotted keys in a nested dict (missing intermediate mappings are created); text fields of `cls` take
    their value as typed (`parse_override`)."""
    for text in overrides:
        path, value = parse_override(text, cls)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigValueError(f"override {'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data


class _DuplicateKey(yaml.YAMLError):
    """A mapping of a config file names a key twice."""

    def __init__(self, key: Any, mark: Any) -> None:
        super().__init__(f"key {key!r} appears twice")
        self.problem_mark = mark


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (PyYAML keeps the last one silently: a
    second `train:` section would drop the first's settings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key != "<<" and key in seen:
                raise _DuplicateKey(key, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file's top-level mapping, or ConfigValueError naming the file and the problem (invalid YAML, a
    key written twice in one mapping)."""
    try:
        text = read_text(path, "config file")
    except UserError as err:
        raise ConfigValueError(str(err)) from err
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except _DuplicateKey as err:
        raise ConfigValueError(f"{path}: line {err.problem_mark.line + 1}: {err}") from None
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
    return from_dict(cls, apply_overrides(data, overrides, cls))
