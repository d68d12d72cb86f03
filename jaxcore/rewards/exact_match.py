"""Exact-match and per-character (digit) match rewards against ``str(answer)``.

The prediction is ``completion.strip()``, cut to its first line when ``first_line=True``.

* exact_match: 1.0 if ``pred == str(answer).strip()`` else 0.0.
* digit_match: fraction of character positions where ``pred`` and the reference agree,
  over ``max(len(pred), len(ref))`` positions; the shorter string is padded on the left
  (``align="right"``, the default: digits line up by place value, so "146" vs "46" = 2/3)
  or on the right (``align="left"``). Two empty strings give 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from jaxcore.rewards.types import Example, map_samples

Align = Literal["left", "right"]


def prediction(completion: str, first_line: bool = True) -> str:
    """The compared text: stripped completion, cut at the first newline if asked."""
    text = completion.strip()
    return text.split("\n", 1)[0].strip() if first_line else text


def exact_match_score(completion: str, answer: Any, first_line: bool = True) -> float:
    """1.0 if the prediction equals ``str(answer).strip()``, else 0.0."""
    return 1.0 if prediction(completion, first_line) == str(answer).strip() else 0.0


def digit_match_score(
    completion: str, answer: Any, first_line: bool = True, align: Align = "right"
) -> float:
    """Fraction of aligned character positions equal to the reference's."""
    if align not in ("left", "right"):
        raise ValueError(f"align must be 'left' or 'right', got {align!r}")
    pred, ref = prediction(completion, first_line), str(answer).strip()
    width = max(len(pred), len(ref))
    if width == 0:
        return 1.0
    if align == "right":
        pred, ref = pred[::-1], ref[::-1]
    return sum(p == r for p, r in zip(pred, ref)) / width


def exact_match_reward(
    completions: Sequence[str], examples: Sequence[Example], *, first_line: bool = True
) -> list[float | None]:
    """Batched :func:`exact_match_score`."""
    return map_samples(
        lambda c, a: exact_match_score(c, a, first_line=first_line), completions, examples
    )


def digit_match_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    first_line: bool = True,
    align: Align = "right",
) -> list[float | None]:
    """Batched :func:`digit_match_score`."""
    return map_samples(
        lambda c, a: digit_match_score(c, a, first_line=first_line, align=align),
        completions,
        examples,
    )
