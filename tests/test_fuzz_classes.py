"""Property-based fuzz (hypothesis, derandomized) of the input classes an outside pass found defects in: what a
reward function returns, rewards of any finite size in the GRPO and ES statistics, what a reward function does to
the rows it is given, and what a tool returns. Each oracle is written here from the documented rule, not taken
from the code it checks.

The classes that are not values (signals at each phase, hangs, files in out_dir, one-line errors of commands) are
table cases: test_cli.py, test_fuzz_cli.py, test_fuzz_outputs.py, rewards/test_stop_continue.py,
runtime/test_export_signals.py.
"""

from __future__ import annotations

import asyncio
import copy
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jaxcore.agents.tools import tool_text
from jaxcore.es.eggroll import shape_fitness
from jaxcore.grpo.advantages import compute_advantages
from jaxcore.rewards.scoring import Scorer
from jaxcore.rewards.types import Example
from jaxcore.rewards.user_functions import TRLReward

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow])
FLOAT32_MAX = float(np.finfo(np.float32).max)
SAMPLES = 3
FALLBACK = -7.0


# --------------------------------------------------------------------------- what a reward function returns

ONE_VALUE = st.one_of(
    st.none(), st.floats(), st.integers(min_value=-(10**400), max_value=10**400), st.booleans(),
    st.text(max_size=3), st.fractions(max_denominator=7), st.floats(width=32).map(np.float32),
    st.integers(-(2**62), 2**62).map(np.int64), st.lists(st.floats(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.floats(), max_size=2),
)
RETURNED = st.one_of(
    st.lists(ONE_VALUE, min_size=SAMPLES, max_size=SAMPLES),
    st.lists(ONE_VALUE, max_size=5),
    st.tuples(ONE_VALUE, ONE_VALUE, ONE_VALUE),
    st.lists(st.floats(), min_size=SAMPLES, max_size=SAMPLES).map(np.asarray),
    st.floats().map(np.asarray),                                      # a 0-d array
    st.lists(st.floats(), min_size=SAMPLES, max_size=SAMPLES).map(lambda v: np.asarray(v).reshape(1, -1)),
    st.dictionaries(st.text(max_size=2), st.floats(), min_size=SAMPLES, max_size=SAMPLES),
    ONE_VALUE,
)


def documented_rewards(returned: Any) -> np.ndarray | None:
    """docs/your-task.md's rule: a list (tuple, 1-d array) of one value per sample, each None (skipped) or a real number
    finite in float32 (the precision training computes in); anything else (a dict, a string, a
    scalar, a 0-d array, the wrong count, an infinity, a number too large) fails the whole call. Returns the
    values (NaN where None), or None where the call fails."""
    if isinstance(returned, np.ndarray):
        if returned.ndim != 1:
            return None
        returned = returned.tolist()
    if not isinstance(returned, (list, tuple)) or len(returned) != SAMPLES:
        return None
    values = []
    for value in returned:
        if value is None:
            values.append(math.nan)
            continue
        if not isinstance(value, (int, float, Fraction, np.floating, np.integer)):
            return None
        if isinstance(value, int) and abs(value) > 2**128:
            return None
        number = float(value)
        with np.errstate(over="ignore"):
            if not np.isfinite(np.float32(number)):
                return None
        values.append(number)
    return np.asarray(values)


@FUZZ
@given(returned=RETURNED, asynchronous=st.booleans())
def test_what_a_reward_function_returns_is_its_rewards_or_a_counted_fallback(returned, asynchronous):
    """Never an exception out of scoring: the rewards the function gave, or the fallback for each sample, counted.
    (Before: a dict was read as its keys, a 0-d array was "len() of unsized object", 10**400 ended the run.)"""
    def reward(prompts, completions, **_columns):
        return returned

    async def async_reward(prompts, completions, **_columns):
        return returned

    with Scorer({"r": TRLReward("r", fn=async_reward if asynchronous else reward)}, fallback=FALLBACK) as scorer:
        result = scorer.score(["c"] * SAMPLES, [Example(prompt="p")] * SAMPLES)
    expected = documented_rewards(returned)
    assert np.isfinite(result.rewards_B).all()
    if expected is None:
        assert result.failures == {"r": SAMPLES}
        assert result.rewards_B.tolist() == [FALLBACK] * SAMPLES
    else:
        assert result.failures == {"r": 0}
        np.testing.assert_array_equal(result.per_function["r"], expected)
        np.testing.assert_array_equal(result.rewards_B, np.nan_to_num(expected).astype(np.float32))


# --------------------------------------------------------------------------- rewards of any finite size

FINITE32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
REWARD_ROWS = st.integers(1, 4).flatmap(lambda groups: st.lists(
    FINITE32, min_size=2 * groups, max_size=2 * groups))


def close_in_units_of_the_spread(got: np.ndarray, expected: np.ndarray, rewards: np.ndarray, std: np.ndarray
                                 ) -> None:
    """float32 against float64: an error of a few float32 ulps of the largest reward, in units of the std."""
    ulps = 8 * np.abs(rewards).max() * np.finfo(np.float32).eps
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 + float(np.max(ulps / std)))


@FUZZ
@given(rewards=REWARD_ROWS, scale=st.sampled_from(["group", "batch"]))
@example(rewards=[FLOAT32_MAX, -FLOAT32_MAX], scale="group")
@example(rewards=[1e20, 3e20, -1e20, 0.0], scale="batch")
def test_grpo_advantages_of_any_finite_rewards_are_finite_and_trls(rewards, scale):
    """TRL's advantages (r - group mean) / (std + 1e-4), computed in float64 here, for rewards anywhere in
    float32's range. (Before: rewards of ~1e20 gave an inf std; rewards spread over float32's range, inf - inf.)"""
    rewards_GN = np.asarray(rewards, np.float64).reshape(-1, 2)
    centred = rewards_GN - rewards_GN.mean(1, keepdims=True)
    if scale == "group":
        std = np.repeat(rewards_GN.std(1, ddof=1), 2).reshape(-1, 2)
    else:
        std = np.full_like(rewards_GN, rewards_GN.std(ddof=1))
    expected = (centred / (std + 1e-4)).reshape(-1)
    got = np.asarray(compute_advantages(np.asarray(rewards, np.float32), 2, scale))
    assert np.isfinite(got).all(), (rewards, got)
    close_in_units_of_the_spread(got, expected, np.asarray(rewards), std.reshape(-1) + 1e-4)


@FUZZ
@given(fitness=st.lists(FINITE32, min_size=2, max_size=8))
@example(fitness=[FLOAT32_MAX, -FLOAT32_MAX])
def test_es_z_scores_of_any_finite_fitness_are_finite_and_exact(fitness):
    """(f - mean) / sqrt(var + 1e-5) in float64, for fitness anywhere in float32's range."""
    f = np.asarray(fitness, np.float64)
    std = np.sqrt(f.var() + 1e-5)
    got = np.asarray(shape_fitness(np.asarray(fitness, np.float32), "zscore"))
    assert np.isfinite(got).all(), (fitness, got)
    close_in_units_of_the_spread(got, (f - f.mean()) / std, f, std)


# --------------------------------------------------------------------------- what a reward function does to its rows

ROW_VALUES = st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=4)),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                                                       max_size=3), max_leaves=6)
EDITS = st.lists(st.sampled_from(["append", "clear", "set", "delete", "replace_content"]), min_size=1, max_size=4)


def edit_everything(value: Any, edit: str) -> None:
    """Change `value` in place, down to every nested list and dict."""
    if isinstance(value, list):
        for item in value:
            edit_everything(item, edit)
        {"append": lambda: value.append("x"), "clear": value.clear, "set": lambda: value.insert(0, 0),
         "delete": lambda: value.pop() if value else None, "replace_content": lambda: value.reverse()}[edit]()
    elif isinstance(value, dict):
        for item in list(value.values()):
            edit_everything(item, edit)
        if edit == "clear":
            value.clear()
        elif edit == "delete" and value:
            value.pop(next(iter(value)))
        elif edit == "replace_content" and "content" in value:
            value["content"] = "edited"
        else:
            value["added"] = edit


@FUZZ
@given(column=ROW_VALUES, edits=EDITS, conversational=st.booleans())
def test_a_reward_function_that_edits_what_it_is_given_leaves_the_rows_alone(column, edits, conversational):
    """(Before: an edit to `prompts` or a column changed the dataset, so later epochs, a resumed run and a run with
    reward workers saw three different datasets.)"""
    prompt = [{"role": "user", "content": "q"}] if conversational else "q"
    rows = [Example(prompt=copy.deepcopy(prompt), answer="a", columns={"extra": copy.deepcopy(column)})
            for _ in range(2)]
    before = copy.deepcopy([(row.prompt, row.answer, dict(row.columns)) for row in rows])

    def editing(prompts, completions, extra, **_columns):
        for edit in edits:
            for received in (prompts, completions, extra):
                edit_everything(received, edit)
        return [1.0, 1.0]

    with Scorer({"edit": TRLReward("edit", fn=editing, columns=["extra"])}) as scorer:
        assert scorer.score(["c", "d"], rows).failures == {"edit": 0}
        assert [(row.prompt, row.answer, dict(row.columns)) for row in rows] == before


# --------------------------------------------------------------------------- what a tool returns

class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


TOOL_RESULTS = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=4),
                         st.lists(st.integers(), max_size=3), st.just(Unprintable()),
                         st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@FUZZ
@given(result=TOOL_RESULTS, asynchronous=st.booleans())
def test_a_tools_result_is_its_text_or_the_calls_error(result, asynchronous):
    """The model reads `str(result)` (TRL's), of the awaited result for an async tool; a result that has no text
    is the call's error, never a coroutine's repr. (Before: an async tool's coroutine was sent as a success.)"""
    def tool(**_arguments):
        return result

    async def async_tool(**_arguments):
        await asyncio.sleep(0)
        return result

    if isinstance(result, Unprintable):
        with pytest.raises(RuntimeError, match="no text"):
            tool_text(async_tool if asynchronous else tool, {})
    else:
        assert tool_text(async_tool if asynchronous else tool, {}) == str(result)
