"""Numeric answer reward: the last ``<answer>`` number is within a relative tolerance.

``reward = 1.0`` if ``|pred - ref| <= max(rel_tol * |ref|, abs_tol)`` else ``0.0``
(defaults ``rel_tol=0.05``, ``abs_tol=1e-9``, so a reference of 0 needs ``|pred| <= 1e-9``).
``pred`` is parsed from the last ``<answer>...</answer>`` block by :func:`parse_number`;
no block or no parsable number gives 0.0. ``Example.answer`` is a number (or numeric string).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from jaxcore.rewards.text import last_answer
from jaxcore.rewards.types import Example, map_samples

_NUMBER_RE = re.compile(
    r"""
    (?P<sign>[+-]?)\s*
    (?P<mantissa>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)   # 1,234.5  12.  .5
    (?:[eE](?P<exp>[+-]?\d+))?                                # 1.5e-3
    (?:\s*[x×*]\s*10\s*\^\s*\{?(?P<exp10>[+-]?\d+)\}?)?       # 1.5 x 10^3
    (?P<rest>.*)
    """,
    re.VERBOSE | re.DOTALL,
)
_UNIT_START_RE = re.compile(r"[^\W\d_]|[°%]")


def parse_number(text: str) -> float | None:
    """Parse ``"12.5 km"`` -> 12.5, ``"1,234"`` -> 1234.0, ``"2.5e3"`` -> 2500.0.

    Accepts a sign, thousands commas, a decimal point, ``e`` notation and ``x 10^k``,
    followed by nothing, a trailing period, or a unit (text starting with a letter, ``°``
    or ``%``). Anything else (``"3,5"``, ``"about 3"``, ``"12 / 4"``) gives None.
    """
    match = _NUMBER_RE.fullmatch(text.strip().replace("\u2212", "-"))
    if match is None:
        return None
    rest = match["rest"].strip().rstrip(".").strip()
    if rest and not _UNIT_START_RE.match(rest):
        return None
    exponent = int(match["exp"] or 0) + int(match["exp10"] or 0)
    value = float(f"{match['sign']}{match['mantissa'].replace(',', '')}e{exponent}")
    return value if math.isfinite(value) else None


def reference_value(answer: Any) -> float:
    """The reference as a float; raises ValueError if it is not numeric."""
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    value = parse_number(answer) if isinstance(answer, str) else None
    if value is None:
        raise ValueError(f"numeric reward needs a numeric answer, got {answer!r}")
    return value


def numeric_score(
    completion: str, answer: Any, rel_tol: float = 0.05, abs_tol: float = 1e-9
) -> float:
    """1.0 if the last ``<answer>`` number is within tolerance of ``answer``, else 0.0."""
    ref = reference_value(answer)
    content = last_answer(completion)
    pred = parse_number(content) if content is not None else None
    if pred is None:
        return 0.0
    return 1.0 if abs(pred - ref) <= max(rel_tol * abs(ref), abs_tol) else 0.0


def numeric_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    rel_tol: float = 0.05,
    abs_tol: float = 1e-9,
) -> list[float | None]:
    """Batched :func:`numeric_score`."""
    return map_samples(
        lambda c, a: numeric_score(c, a, rel_tol=rel_tol, abs_tol=abs_tol), completions, examples
    )
