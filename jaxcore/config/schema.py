"""The config schema: every setting's type and range is declared once, on its dataclass field
(`Annotated[int, Ge(1)]`, `Literal["sgd", "adam"]`, ...), and checked here with pydantic before any model
is loaded. A value that does not fit is one line naming the key, the value and what is allowed:

    train.epochs=-3: must be >= 1
    es.shaping='bogus': must be 'zscore', 'group_zscore', 'centered_rank' or 'none'

`check(cfg)` walks a whole config (the Python API calls it before any work); a dataclass derived from
`Checked` checks its fields whenever it is constructed (its own `__post_init__` keeps only the rules between
fields); `value_of` converts and checks one YAML value (`yaml_config`); `flag_type`/`field_flag` turn a
declaration into an argparse `type=` for a command-line flag; `ranges` lists them all (the list in docs/es.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import annotated_types
import pydantic

from jaxcore.errors import ConfigTypeError, ConfigValueError, UserError, check_text

# Every float of every config is finite: NaN compares false with every bound and would slip through.
_STRICT = pydantic.ConfigDict(allow_inf_nan=False, arbitrary_types_allowed=True)


@functools.cache
def _adapter(hint: Any) -> pydantic.TypeAdapter:
    if section_type(hint) is not None:          # a section: the instance itself (pydantic takes no config here)
        return pydantic.TypeAdapter(hint)
    return pydantic.TypeAdapter(hint, config=_STRICT)


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """{field name: its annotation, constraints included} of a dataclass."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def section_type(hint: Any) -> type | None:
    """The dataclass a field holds (`LoRAConfig` for `LoRAConfig | None`), or None for a plain value."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    sections = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return sections[0] if len(sections) == 1 else None


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
               "list": "a list", "tuple": "a list", "dict": "a mapping", "none": "null"}


def _allowed(error: dict[str, Any]) -> str:
    """What a pydantic error says is allowed, as "must be ..."."""
    kind, ctx = error["type"], error.get("ctx", {})
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        bound = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {bound:g}" if isinstance(bound, float) else f"must be {bounds[kind]} {bound}"
    if kind == "multiple_of":
        return "must be even" if ctx["multiple_of"] == 2 else f"must be a multiple of {ctx['multiple_of']}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    if kind.startswith("dataclass"):
        return f"must be a section ({ctx.get('class_name', 'a mapping')})"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} item(s)"
    if kind in ("int_from_float", "int_parsing", "int_type"):
        return "must be an integer"
    if kind == "sequence_str":
        return "must be a list of strings"
    for word, text in _TYPE_WORDS.items():
        if kind.startswith(word + "_"):
            return f"must be {text}"
    return str(error["msg"]).replace("Input should be", "must be").replace("Value error, ", "")


def _is_type_error(error: dict[str, Any]) -> bool:
    return error["type"].endswith(("_type", "_parsing")) or error["type"] == "int_from_float"


def _first_error(err: pydantic.ValidationError) -> dict[str, Any]:
    """The error to report: of a union (`float | None`), the branch that is not None."""
    errors = err.errors(include_url=False)
    return next((e for e in errors if e["type"] != "none_required"), errors[0])


def _raise(key: str, value: Any, err: pydantic.ValidationError) -> typing.NoReturn:
    error = _first_error(err)
    where = "".join(f"[{part}]" for part in error["loc"] if isinstance(part, int))
    shown = error.get("input", value) if where else value
    kind = ConfigTypeError if _is_type_error(error) else ConfigValueError
    raise kind(f"{key}{where}={shown!r}: {_allowed(error)}") from None


# YAML 1.1 (PyYAML) reads an exponent without a dot (1e-3) as a string.
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _yaml_number(value: Any) -> Any:
    """The number a YAML value means where one is expected: 1e-3 (a string to YAML 1.1), and 3.0 is the
    integer 3; None when it means none."""
    if isinstance(value, str):
        if not (_EXPONENT.fullmatch(value.strip()) or value.strip().lower().lstrip("+-") in ("nan", "inf")):
            return None
        value = float(value)                # nan and inf are numbers, which then fail "must be finite"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value if isinstance(value, float) else None


def value_of(hint: Any, value: Any, key: str, *, from_text: bool = False) -> Any:
    """`value` checked against `hint` (strictly: "4" is not an integer), or ConfigTypeError/ConfigValueError
    naming `key`. `from_text`: a value parsed from YAML or a flag, where "1e-3" and 3.0 mean numbers."""
    adapter = _adapter(hint)
    try:
        return _text_checked(adapter.validate_python(value, strict=True), key)
    except pydantic.ValidationError as err:
        number = _yaml_number(value) if from_text and not isinstance(value, bool) else None
        if number is None:
            _raise(key, value, err)
    try:
        return adapter.validate_python(number, strict=True)
    except pydantic.ValidationError as err:
        _raise(key, number, err)


def _text_checked(value: Any, key: str) -> Any:
    """`value`, unless a string in it holds an unpaired surrogate (no tokenizer or file takes one)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        for text in (item for item in items if isinstance(item, str)):
            check_text(text, key)
    except UserError as err:
        raise ConfigValueError(str(err)) from None
    return value


def check(cfg: Any, prefix: str = "") -> None:
    """Check every field of a (nested) dataclass config against its declaration; the first misfit raises
    ConfigTypeError/ConfigValueError naming the dotted key (`prefix` + field)."""
    for name, hint in field_hints(type(cfg)).items():
        value, key = getattr(cfg, name), f"{prefix}{name}"
        section = section_type(hint)
        if section is not None and isinstance(value, section):
            check(value, f"{key}.")
        else:
            value_of(hint, value, key)


class Checked:
    """Base of a config dataclass whose construction checks every field (`check`); a subclass's own
    `__post_init__` calls `super().__post_init__()` first, then checks the rules between its fields."""

    def __post_init__(self) -> None:
        check(self)


def flag_type(hint: Any, flag: str = "value") -> Callable[[str], Any]:
    """An argparse `type=` that parses a flag's text (as YAML: 1e-3, null) and checks it against `hint`; a
    misfit is argparse's one-line usage error ("argument --top-p: must be <= 1, got '2'")."""
    return _flag_parser(lambda: hint, flag)


def field_flag(path: str, name: str) -> Callable[[str], Any]:
    """`flag_type` of field `name` of the config dataclass at `path` ("jaxcore.runtime.config.TrainConfig"),
    so a flag and its config key share one declaration of their range. The class is imported when the flag
    is parsed: building the parser imports nothing heavy."""

    def hint() -> Any:
        module, _, cls = path.rpartition(".")
        return field_hints(getattr(importlib.import_module(module), cls))[name]

    return _flag_parser(hint, name)


def _flag_parser(hint: Callable[[], Any], flag: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        import yaml

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        try:
            return value_of(hint(), value, flag, from_text=True)
        except ConfigValueError as err:
            raise argparse.ArgumentTypeError(f"{str(err).split(': ', 1)[-1]}, got {text!r}") from None

    parse.__name__ = "value"
    return parse


def ranges(cls: type, prefix: str = "") -> dict[str, str]:
    """{dotted key: what it allows} for every field of a (nested) config whose declaration narrows its type
    (bounds, choices, a minimum length): docs/es.md's list of ranges is generated from this."""
    out: dict[str, str] = {}
    for name, hint in field_hints(cls).items():
        section = section_type(hint)
        if section is not None:
            out.update(ranges(section, f"{prefix}{name}."))
        elif text := _describe(hint):
            out[f"{prefix}{name}"] = text
    return out


def _describe(hint: Any) -> str:
    """"in (0, 1]", ">= 1", "even, >= 2", "float32 | bfloat16"... of one annotation ("" when it only has a type)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(p for p in parts if p) + (" (or null)" if type(None) in typing.get_args(hint) else "") \
            if any(parts) else ""
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(map(str, typing.get_args(hint)))
    if typing.get_origin(hint) is not typing.Annotated:
        return ""
    base, *metadata = typing.get_args(hint)
    bounds: dict[str, Any] = {}
    words = []
    for item in metadata:
        for part in (item if isinstance(item, annotated_types.Interval) else [item]):
            bounds.update({k: getattr(part, k) for k in ("gt", "ge", "lt", "le") if getattr(part, k, None) is not None})
            if isinstance(part, annotated_types.MultipleOf):
                words.append("even" if part.multiple_of == 2 else f"a multiple of {part.multiple_of}")
            if isinstance(part, annotated_types.MinLen):
                words.append(f"at least {part.min_length} item(s)")
    low = [f"{'>' if k == 'gt' else '>='} {v:g}" for k, v in bounds.items() if k in ("gt", "ge")]
    high = [f"{'<' if k == 'lt' else '<='} {v:g}" for k, v in bounds.items() if k in ("lt", "le")]
    if low and high:
        words.append(f"in {'(' if 'gt' in bounds else '['}{bounds.get('gt', bounds.get('ge')):g}, "
                     f"{bounds.get('lt', bounds.get('le')):g}{')' if 'lt' in bounds else ']'}")
    else:
        words.extend(low + high)
    return ", ".join(words)


def ranges_markdown(*configs: type) -> str:
    """docs/es.md's list: one line per section, the union of `ranges` over `configs`."""
    merged: dict[str, str] = {}
    for cls in configs:
        merged.update(ranges(cls))
    sections: dict[str, list[str]] = {}
    for key, text in merged.items():
        section, _, rest = key.partition(".")
        sections.setdefault(section, []).append(f"`{rest}` {text}")
    return "\n".join(f"- `{section}:` " + "; ".join(items) for section, items in sections.items())
