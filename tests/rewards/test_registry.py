"""Reward and task registry: lookups, options, clear errors, picklability."""

import pickle

import pytest

from jaxcore.rewards import REWARDS, TASKS, get_reward, get_task
from jaxcore.rewards.types import Example


def test_known_names() -> None:
    assert sorted(REWARDS) == [
        "bleu",
        "chess_fen",
        "countdown",
        "countdown_answer",
        "countdown_format",
        "digit_match",
        "exact_match",
        "numeric",
    ]
    assert sorted(TASKS) == ["addition", "chess_fen", "countdown", "file", "unit_conversion"]


def test_unknown_names_list_known_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown reward 'bleu4' \(known: bleu, chess_fen, "):
        get_reward("bleu4")
    with pytest.raises(
        ValueError,
        match=r"^unknown task 'gsm8k' \(known: addition, chess_fen, countdown, file, "
        r"unit_conversion\)$",
    ):
        get_task("gsm8k")


def test_reward_options_are_bound_and_checked() -> None:
    fn = get_reward("numeric", rel_tol=0.5)
    assert fn(["<answer>140</answer>"], [Example("p", 100.0)]) == [1.0]
    assert pickle.loads(pickle.dumps(fn))(["<answer>160</answer>"], [Example("p", 100.0)]) == [0.0]
    assert get_reward("exact_match") is REWARDS["exact_match"]
    with pytest.raises(
        ValueError,
        match=r"^reward 'numeric': got an unexpected keyword argument 'tol' "
        r"\(parameters: rel_tol, abs_tol\)$",
    ):
        get_reward("numeric", tol=0.1)


def test_task_options_are_checked() -> None:
    assert get_task("addition", digits=4).examples("train", 1, 0)[0].prompt.count("+") == 1
    with pytest.raises(ValueError, match=r"^task 'addition': got an unexpected keyword argument"):
        get_task("addition", digit=4)
    with pytest.raises(ValueError, match=r"^task 'file': missing a required argument: 'path'"):
        get_task("file")


@pytest.mark.parametrize("name", ["addition", "countdown", "chess_fen", "unit_conversion"])
def test_task_reward_fns_are_picklable(name: str) -> None:
    task = get_task(name)
    assert set(task.reward_fns) == set(task.reward_weights)
    pickle.dumps(task.reward_fns)
