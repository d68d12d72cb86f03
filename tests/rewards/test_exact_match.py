"""Exact-match and digit-match rewards."""

import pytest

from jaxcore.rewards.exact_match import (
    digit_match_reward,
    digit_match_score,
    exact_match_reward,
    exact_match_score,
)
from jaxcore.rewards.types import Example


def test_exact_match() -> None:
    assert exact_match_score("46", "46") == 1.0
    assert exact_match_score("  46  \nbecause 12+34=46", "46") == 1.0
    assert exact_match_score("  46  \nbecause", "46", first_line=False) == 0.0
    assert exact_match_score("\n\n46\n", "46", first_line=True) == 1.0
    assert exact_match_score("046", "46") == 0.0
    assert exact_match_score("46", 46) == 1.0
    assert exact_match_score("", "46") == 0.0


@pytest.mark.parametrize(
    ("pred", "ref", "align", "expected"),
    [
        ("46", "46", "right", 1.0),
        ("47", "46", "right", 0.5),
        ("146", "46", "right", 2 / 3),  # place values line up
        ("146", "46", "left", 0.0),
        ("4", "46", "right", 0.0),
        ("4", "46", "left", 0.5),
        ("1234", "1243", "right", 0.5),
        ("", "46", "right", 0.0),
        ("", "", "right", 1.0),
    ],
)
def test_digit_match(pred: str, ref: str, align: str, expected: float) -> None:
    assert digit_match_score(pred, ref, align=align) == expected  # type: ignore[arg-type]


def test_digit_match_bad_align() -> None:
    with pytest.raises(ValueError, match="align must be 'left' or 'right', got 'middle'"):
        digit_match_score("1", "1", align="middle")  # type: ignore[arg-type]


def test_batched() -> None:
    examples = [Example("12+34=", "46"), Example("50+50=", "100")]
    assert exact_match_reward(["46", "10"], examples) == [1.0, 0.0]
    assert digit_match_reward(["46", "10"], examples) == [1.0, 1 / 3]
    assert digit_match_reward(["46", "10"], examples, align="left") == [1.0, 2 / 3]
