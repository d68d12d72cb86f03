"""Countdown reward: hand-worked format and answer cases, including adversarial answers."""

from fractions import Fraction

import pytest

from jaxcore.rewards.countdown import (
    answer_score,
    countdown_answer_reward,
    countdown_format_reward,
    countdown_reward,
    format_score,
    parse_expression,
)
from jaxcore.rewards.types import Example

PUZZLE = {"numbers": [2, 3, 4], "target": 10}


def answer(expr: str) -> str:
    return f"I try things.</think>\n<answer>{expr}</answer>"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("ok</think>\n<answer>2*3+4</answer>", 1.0),  # exact paper format (prompt ends in <think>)
        ("ok</think> <answer>2*3+4</answer>", 0.6),  # no newline between blocks: partial credit
        ("ok</think>\n<answer>2*3+4</answer> done", 0.6),  # trailing text
        ("<answer>2*3+4</answer>", 0.5),  # no </think>
        ("ok</think>", 0.1),  # no answer block
        ("nothing", 0.0),
    ],
)
def test_format_score(completion: str, expected: float) -> None:
    assert format_score(completion) == expected


def test_format_score_end_token_and_prefix() -> None:
    text = "ok</think>\n<answer>1</answer><|im_end|>"
    assert format_score(text) == 0.6
    assert format_score(text, end_token="<|im_end|>") == 1.0
    assert format_score("<think>ok</think>\n<answer>1</answer>", think_prefix="") == 1.0


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("2*3+4", 1.0),
        ("4 + 3 * 2", 1.0),
        ("(4 + 3 * 2)", 1.0),
        ("2*3+4 = 10", 0.0),  # '=' is not allowed
        ("2*2+3*2", 0.0),  # 2 used twice (and 4 missing)
        ("2*3+4+2-2", 0.0),  # 2 used three times
        ("4+3+3", 0.0),  # 3 twice, 2 missing
        ("2*3", 0.0),  # 4 missing, wrong value
        ("2.0*3+4", 0.0),  # non-integer literal
        ("2*3+4.", 0.0),
        ("__import__('os').system('true')", 0.0),
        ("2**3+2", 0.0),  # power is not allowed
        ("(2*3)//1+4", 0.0),  # floor division is not allowed
        ("", 0.0),
        ("2*3+", 0.0),  # syntax error
    ],
)
def test_answer_score(expr: str, expected: float) -> None:
    assert answer_score(answer(expr), PUZZLE) == expected


def test_answer_needs_all_numbers_and_fractions_are_exact() -> None:
    assert answer_score(answer("2*3+4"), {"numbers": [1, 2, 3, 4], "target": 10}) == 0.0
    assert answer_score(answer("2*3+4*1"), {"numbers": [1, 2, 3, 4], "target": 10}) == 1.0
    # intermediate fraction: 83 - 78/39 + 1 = 82 exactly
    assert answer_score(answer("83 - 78/39 + 1"), {"numbers": [83, 78, 39, 1], "target": 82}) == 1.0
    assert answer_score(answer("1/3*3"), {"numbers": [1, 3, 3], "target": 1}) == 1.0
    assert answer_score(answer("-2+3"), {"numbers": [2, 3], "target": 1}) == 1.0  # unary minus
    assert answer_score(answer("2*3+4"), {"numbers": [2, 3, 4], "target": "10"}) == 1.0


def test_division_by_zero_scores_zero() -> None:
    puzzle = {"numbers": [2, 2, 5], "target": 5}
    assert answer_score(answer("5/(2-2)"), puzzle) == 0.0
    assert answer_score(answer("5+2/(2-2)"), puzzle) == 0.0
    assert parse_expression("5/(2-2)") is None


def test_only_last_answer_block_counts() -> None:
    assert answer_score("<answer>1+1</answer> then <answer>2*3+4</answer>", PUZZLE) == 1.0
    assert answer_score("<answer>2*3+4</answer> then <answer>1+1</answer>", PUZZLE) == 0.0
    assert answer_score("2*3+4", PUZZLE) == 0.0  # no answer block


def test_parse_expression() -> None:
    assert parse_expression("(1 + 2) / 3") == ([1, 2, 3], Fraction(1))
    assert parse_expression(" 7 - -2 ") == ([2, 7], Fraction(9))
    assert parse_expression("abs(-3)") is None
    assert parse_expression("(" * 300 + "1" + ")" * 300) is None  # too deeply nested
    assert parse_expression("1+" * 600 + "1") is None  # longer than MAX_EXPRESSION_CHARS
    assert parse_expression("-" * 998 + "1") is None  # too deep to evaluate


def test_malformed_reference_raises() -> None:
    with pytest.raises(ValueError, match="countdown answer must be a dict with 'numbers'"):
        answer_score(answer("1"), {"target": 1})


def test_batched_rewards() -> None:
    examples = [Example("p", PUZZLE)] * 3
    completions = [answer("2*3+4"), "<answer>2*3+4</answer>", answer("2+3+4")]
    assert countdown_format_reward(completions, examples) == [1.0, 0.5, 1.0]
    assert countdown_answer_reward(completions, examples) == [1.0, 1.0, 0.0]
    assert countdown_reward(completions, examples) == pytest.approx([1.1, 1.05, 0.1], abs=1e-12)
    with pytest.raises(ValueError, match="got 1 completions but 3 examples"):
        countdown_reward(completions[:1], examples)
