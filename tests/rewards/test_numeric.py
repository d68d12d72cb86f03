"""Numeric reward and number parsing."""

import pytest

from jaxcore.rewards.numeric import numeric_reward, numeric_score, parse_number
from jaxcore.rewards.types import Example


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.5", 12.5),
        ("12.5 km", 12.5),
        ("12.5km", 12.5),
        ("3,500 meters.", 3500.0),
        ("1,234,567.25", 1234567.25),
        ("2.5e3", 2500.0),
        ("2.5E-3 kg", 0.0025),
        ("1.5 x 10^3", 1500.0),
        ("1.5 × 10^{-2}", 0.015),
        ("-3", -3.0),
        ("\u22123", -3.0),  # unicode minus
        ("+ 4", 4.0),
        ("42.", 42.0),
        (".5", 0.5),
        ("25%", 25.0),
        ("-40 °F", -40.0),
        ("3,5", None),  # decimal comma is not a thousands separator
        ("1,00", None),
        ("about 3", None),
        ("12 / 4", None),
        ("1e999", None),  # overflows to inf
        ("", None),
        ("km", None),
    ],
)
def test_parse_number(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        ("100", 1.0),
        ("104.9", 1.0),  # 4.9 % too high
        ("95.1", 1.0),  # 4.9 % too low
        ("105.1", 0.0),  # 5.1 % too high
        ("94.9", 0.0),  # 5.1 % too low
        ("1.049e2 m", 1.0),
    ],
)
def test_relative_tolerance(pred: str, expected: float) -> None:
    assert numeric_score(f"Reasoning...\n<answer>{pred}</answer>", 100.0) == expected


def test_zero_reference_needs_absolute_tolerance() -> None:
    assert numeric_score("<answer>0</answer>", 0.0) == 1.0
    assert numeric_score("<answer>1e-10</answer>", 0.0) == 1.0
    assert numeric_score("<answer>1e-8</answer>", 0.0) == 0.0


def test_extraction_and_options() -> None:
    assert numeric_score("100", 100.0) == 0.0  # no answer block
    assert numeric_score("<answer>7</answer> <answer>100</answer>", 100.0) == 1.0
    assert numeric_score("<answer>100</answer> <answer>7</answer>", 100.0) == 0.0
    assert numeric_score("<answer>hundred</answer>", 100.0) == 0.0
    assert numeric_score("<answer>104.9</answer>", 100.0, rel_tol=0.01) == 0.0
    assert numeric_score("<answer>-104.9</answer>", -100) == 1.0
    assert numeric_score("<answer>1000</answer>", "1,000") == 1.0


def test_bad_reference_raises() -> None:
    with pytest.raises(ValueError, match="numeric reward needs a numeric answer, got 'abc'"):
        numeric_score("<answer>1</answer>", "abc")


def test_batched() -> None:
    examples = [Example("p", 3500.0), Example("p", 0.25)]
    completions = ["<answer>3,500 m</answer>", "<answer>0.3</answer>"]
    assert numeric_reward(completions, examples) == [1.0, 0.0]
    assert numeric_reward(completions, examples, rel_tol=0.25) == [1.0, 1.0]
