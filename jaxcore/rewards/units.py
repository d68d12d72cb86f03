"""Unit table and the unit-conversion problem generator."""

from __future__ import annotations

import random
from dataclasses import dataclass

from jaxcore.rewards.types import Example

UNIT_PROMPT = (
    "Convert {value} {source} to {target}. Reason step by step, then give the final number "
    "in <answer> </answer> tags, for example <answer>12.5</answer>."
)


@dataclass(frozen=True)
class Unit:
    """A unit: ``base = value * factor + offset`` in its dimension's base unit."""

    singular: str
    plural: str
    factor: float
    offset: float = 0.0


def _u(singular: str, factor: float, plural: str | None = None, offset: float = 0.0) -> Unit:
    return Unit(singular, plural or singular + "s", factor, offset)


UNITS: dict[str, tuple[Unit, ...]] = {
    "length": (  # base: meter
        _u("millimeter", 1e-3),
        _u("centimeter", 1e-2),
        _u("meter", 1.0),
        _u("kilometer", 1e3),
        _u("inch", 0.0254, "inches"),
        _u("foot", 0.3048, "feet"),
        _u("yard", 0.9144),
        _u("mile", 1609.344),
        _u("nautical mile", 1852.0),
    ),
    "mass": (  # base: kilogram
        _u("milligram", 1e-6),
        _u("gram", 1e-3),
        _u("kilogram", 1.0),
        _u("metric ton", 1e3),
        _u("ounce", 0.028349523125),
        _u("pound", 0.45359237),
        _u("stone", 6.35029318, "stone"),
    ),
    "time": (  # base: second
        _u("millisecond", 1e-3),
        _u("second", 1.0),
        _u("minute", 60.0),
        _u("hour", 3600.0),
        _u("day", 86400.0),
        _u("week", 604800.0),
    ),
    "volume": (  # base: liter
        _u("milliliter", 1e-3),
        _u("liter", 1.0),
        _u("cubic meter", 1e3),
        _u("teaspoon", 0.00492892159375),
        _u("tablespoon", 0.01478676478125),
        _u("US fluid ounce", 0.0295735295625),
        _u("US cup", 0.2365882365),
        _u("US pint", 0.473176473),
        _u("US quart", 0.946352946),
        _u("US gallon", 3.785411784),
        _u("imperial gallon", 4.54609),
    ),
    "temperature": (  # base: kelvin
        _u("degree Celsius", 1.0, "degrees Celsius", offset=273.15),
        _u("degree Fahrenheit", 5 / 9, "degrees Fahrenheit", offset=273.15 - 32 * 5 / 9),
        _u("kelvin", 1.0),
    ),
}


def convert(value: float, source: Unit, target: Unit) -> float:
    """``value`` in ``source`` units expressed in ``target`` units (same dimension)."""
    return (value * source.factor + source.offset - target.offset) / target.factor


def unit_conversion_example(rng: random.Random) -> Example:
    """``"Convert 3.5 kilometers to meters. ..."`` with the exact float answer."""
    dimension = rng.choice(sorted(UNITS))
    source, target = rng.sample(UNITS[dimension], 2)
    low = -40.0 if dimension == "temperature" else 0.1
    value = round(rng.uniform(low, 1000.0), rng.choice((0, 1, 2))) or 1.0
    name = source.singular if value == 1 else source.plural
    prompt = UNIT_PROMPT.format(value=f"{value:g}", source=name, target=target.plural)
    return Example(prompt=prompt, answer=convert(value, source, target))
