"""Procedural tasks: determinism, train/eval disjointness and correct references."""

import random
import re

import chess
import pytest

from jaxcore.rewards.countdown import answer_score
from jaxcore.rewards.generators import addition_example, chess_example, countdown_example
from jaxcore.rewards.registry import get_task
from jaxcore.rewards.tasks import ProceduralTask, in_eval_partition
from jaxcore.rewards.types import Example, TaskError
from jaxcore.rewards.units import UNITS, convert, unit_conversion_example

PROCEDURAL = ["addition", "countdown", "chess_fen", "unit_conversion"]


@pytest.mark.parametrize("name", PROCEDURAL)
def test_deterministic_per_seed(name: str) -> None:
    task = get_task(name)
    first = task.examples("train", 30, seed=7)
    assert first == get_task(name).examples("train", 30, seed=7)
    assert first != task.examples("train", 30, seed=8)
    assert len(first) == 30


@pytest.mark.parametrize("name", PROCEDURAL)
def test_train_and_eval_are_disjoint(name: str) -> None:
    task = get_task(name)
    train = {e.prompt for seed in (0, 1) for e in task.examples("train", 300, seed)}
    evals = {e.prompt for seed in (0, 1) for e in task.examples("eval", 60, seed)}
    assert len(evals) > 1
    assert not train & evals
    assert all(in_eval_partition(p, 0.1) for p in evals)
    assert not any(in_eval_partition(p, 0.1) for p in train)


def test_addition_examples() -> None:
    assert addition_example(random.Random(0), digits=2) == Example("59+63=", "122")
    task = get_task("addition", digits=3)
    for ex in task.examples("train", 50, 0):
        a, b = re.fullmatch(r"(\d{3})\+(\d{3})=", ex.prompt).groups()  # type: ignore[union-attr]
        assert ex.answer == str(int(a) + int(b))
    assert set(task.reward_fns) == {"exact_match"}
    dense = get_task("addition", digit_match_weight=0.5)
    assert dense.reward_weights == {"exact_match": 1.0, "digit_match": 0.5}


def test_small_prompt_space_still_splits() -> None:
    task = get_task("addition", digits=1)  # 100 prompts, about 10 in eval
    evals = {e.prompt for e in task.examples("eval", 200, 0)}
    train = {e.prompt for e in task.examples("train", 500, 0)}
    assert 0 < len(evals) < 30 and not evals & train


def test_exhausted_partition_raises() -> None:
    prompt = next(f"{i}" for i in range(1000) if not in_eval_partition(f"{i}", 0.1))
    task = ProceduralTask(
        name="const",
        generate=lambda rng: Example(prompt, "x"),
        reward_fns={},
        reward_weights={},
        max_draws_per_example=5,
    )
    assert task.examples("train", 2, 0) == [Example(prompt, "x")] * 2
    with pytest.raises(TaskError, match=r"^const: found only 0 of 2 eval examples in 10 draws"):
        task.examples("eval", 2, 0)


def test_bad_split_and_count() -> None:
    task = get_task("addition")
    with pytest.raises(ValueError, match="unknown split 'test'; expected one of train, eval"):
        task.examples("test", 1, 0)
    with pytest.raises(ValueError, match="number of examples must be >= 0, got -1"):
        task.examples("train", -1, 0)
    assert task.examples("eval", 0, 0) == []


@pytest.mark.parametrize("source", ["own", "reasoning_gym"])
def test_countdown_examples_are_solvable(source: str) -> None:
    task = get_task("countdown", source=source)
    assert task.reward_weights == {"countdown_format": 0.1, "countdown_answer": 1.0}
    for ex in task.examples("train", 20, 0):
        numbers, target = ex.answer["numbers"], ex.answer["target"]
        assert 3 <= len(numbers) <= 4 and 1 <= target <= 100
        assert all(1 <= n <= 100 for n in numbers)
        assert f"[{', '.join(map(str, numbers))}]" in ex.prompt
        assert ex.prompt.endswith("Let me solve this step by step.\n<think>")
        assert answer_score(f"<answer>{ex.answer['solution']}</answer>", ex.answer) == 1.0


def test_countdown_bad_options() -> None:
    with pytest.raises(ValueError, match="source must be 'own' or 'reasoning_gym', got 'x'"):
        countdown_example(random.Random(0), source="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="countdown: need 2 <= min_numbers <= max_numbers"):
        get_task("countdown", min_numbers=1)


def test_chess_answer_matches_the_moves() -> None:
    for ex in get_task("chess_fen", min_plies=1, max_plies=30).examples("train", 30, 3):
        moves = ex.prompt.split("\n")[1]
        board = chess.Board()
        for token in moves.split():
            if not token[0].isdigit():
                board.push_san(token)
        assert board.fen() == ex.answer
    one_ply = chess_example(random.Random(0), min_plies=1, max_plies=1)
    assert re.search(r"\n1\. \S+\n", one_ply.prompt)


def test_unit_conversion_table() -> None:
    by_name = {u.singular: u for units in UNITS.values() for u in units}
    assert convert(3.5, by_name["kilometer"], by_name["meter"]) == pytest.approx(3500.0)
    assert convert(1.0, by_name["mile"], by_name["kilometer"]) == pytest.approx(1.609344)
    assert convert(100.0, by_name["degree Celsius"], by_name["degree Fahrenheit"]) == (
        pytest.approx(212.0)
    )
    assert convert(32.0, by_name["degree Fahrenheit"], by_name["degree Celsius"]) == (
        pytest.approx(0.0, abs=1e-9)
    )
    assert convert(0.0, by_name["kelvin"], by_name["degree Celsius"]) == pytest.approx(-273.15)
    assert convert(2.0, by_name["hour"], by_name["minute"]) == pytest.approx(120.0)
    assert convert(1.0, by_name["US gallon"], by_name["liter"]) == pytest.approx(3.785411784)
    assert convert(1.0, by_name["pound"], by_name["ounce"]) == pytest.approx(16.0)


def test_unit_conversion_examples() -> None:
    by_name = {n: u for units in UNITS.values() for u in units for n in (u.singular, u.plural)}
    pattern = re.compile(r"Convert (-?[\d.]+) (.+?) to (.+?)\. Reason step by step")
    for ex in get_task("unit_conversion").examples("train", 50, 0):
        value, source, target = pattern.match(ex.prompt).groups()  # type: ignore[union-attr]
        assert ex.answer == convert(float(value), by_name[source], by_name[target])
        assert "<answer>" in ex.prompt
    assert unit_conversion_example(random.Random(1)) == unit_conversion_example(random.Random(1))
