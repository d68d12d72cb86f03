"""Scoring: weighted NaN-aware sums and failure isolation, in-process and in workers."""

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jaxcore.rewards.scoring import Scorer, ScoringStopped, score
from jaxcore.rewards.types import Example


# Reward functions must be module-level so that worker processes can unpickle them.
def length_reward(completions: list[str], examples: list[Example]) -> list[float | None]:
    return [float(len(c)) for c in completions]


def const_one(completions: list[str], examples: list[Example]) -> list[float | None]:
    return [1.0] * len(completions)


def none_on_skip(completions: list[str], examples: list[Example]) -> list[float | None]:
    return [None if c == "skip" else 2.0 for c in completions]


def raise_on_bad(completions: list[str], examples: list[Example]) -> list[float | None]:
    if "bad" in completions:
        raise RuntimeError("boom")
    return [1.0] * len(completions)


def hang_on_hang(completions: list[str], examples: list[Example]) -> list[float | None]:
    if "hang" in completions:
        time.sleep(60)
    return [1.0] * len(completions)


def wrong_count_on_wrong(completions: list[str], examples: list[Example]) -> list[float | None]:
    return [1.0] * (len(completions) + ("wrong" in completions))


def die_on_die(completions: list[str], examples: list[Example]) -> list[float | None]:
    if "die" in completions:
        os._exit(3)
    return [1.0] * len(completions)


def strings(completions: list[str], examples: list[Example]) -> list[float | None]:
    return ["1.0"] * len(completions)  # type: ignore[list-item]


def as_dict(completions: list[str], examples: list[Example]) -> dict[int, float]:
    return {i: 5.0 for i in range(len(completions))}  # type: ignore[return-value]


def zero_d(completions: list[str], examples: list[Example]) -> np.ndarray:
    return np.array(1.0)  # type: ignore[return-value]


def huge_int(completions: list[str], examples: list[Example]) -> list[float | None]:
    return [10**400] * len(completions)  # type: ignore[list-item]


def batch(*completions: str) -> tuple[list[str], list[Example]]:
    return list(completions), [Example(f"p{i}", "") for i in range(len(completions))]


def test_weighted_sum_in_process() -> None:
    result = score(
        *batch("ab", "abcd"), {"len": length_reward, "one": const_one}, {"len": 0.5, "one": 2.0}
    )
    assert result.rewards_B.dtype == np.float32
    assert result.rewards_B.tolist() == [3.0, 4.0]
    assert result.per_function["len"].tolist() == [2.0, 4.0]
    assert result.failures == {"len": 0, "one": 0}


def test_none_is_skipped_like_trl(caplog: pytest.LogCaptureFixture) -> None:
    result = score(*batch("skip", "abc"), {"none": none_on_skip, "len": length_reward}, None)
    assert result.rewards_B.tolist() == [4.0, 5.0]
    assert np.isnan(result.per_function["none"][0]) and result.per_function["none"][1] == 2.0
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        only = score(*batch("skip", "x"), {"none": none_on_skip}, {"none": 3.0})
    assert only.rewards_B.tolist() == [0.0, 6.0]  # every function said None -> 0
    assert "1 samples have no reward from any function; they get 0" in caplog.text


def test_raising_function_only_fails_its_chunk(caplog: pytest.LogCaptureFixture) -> None:
    fns = {"raise": raise_on_bad, "len": length_reward}
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = score(*batch("a", "bad", "cc", "d"), fns, None, fallback=-1.0, chunk_size=2)
    assert result.rewards_B.tolist() == [0.0, 2.0, 3.0, 2.0]  # -1 + len for samples 0 and 1
    assert result.failures == {"raise": 2, "len": 0}
    assert np.isnan(result.per_function["raise"][:2]).all()
    assert result.per_function["raise"][2:].tolist() == [1.0, 1.0]
    assert [r.name for r in caplog.records] == ["jaxcore.rewards"]
    assert caplog.records[0].getMessage() == (
        "reward 'raise' failed on samples 0:2 (RuntimeError: boom); using fallback -1.0"
    )


def test_wrong_count_and_bad_values_fail(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = score(*batch("wrong", "x"), {"w": wrong_count_on_wrong, "s": strings}, None)
    assert result.rewards_B.tolist() == [0.0, 0.0]
    assert result.failures == {"w": 2, "s": 2}
    assert "(returned 3 values for 2 samples)" in caplog.text
    assert "(returned '1.0' for sample 0; expected a finite number)" in caplog.text


@pytest.mark.parametrize("fn, message", [
    (as_dict, "(returned a dict, not a list of 2 values)"),            # before: its keys, read as rewards
    (zero_d, "(returned a ndarray with no length (a scalar?), not a list of 2 values)"),   # before: TypeError
    (huge_int, "(returned an integer of 1329 bits for sample 0, too large for a float; expected a finite number)"),
])                                                                     # before: OverflowError ended the run
def test_what_user_code_returns_is_checked_in_one_place(fn, message, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = score(*batch("a", "b"), {"f": fn, "len": length_reward}, None, fallback=-1.0)
    assert result.failures == {"f": 2, "len": 0} and result.rewards_B.tolist() == [0.0, 0.0]
    assert message in caplog.text


def test_fallback_none_skips_failed_samples() -> None:
    fns = {"raise": raise_on_bad, "len": length_reward}
    result = score(*batch("bad", "cc"), fns, {"raise": 5.0, "len": 1.0}, fallback=None)
    assert result.rewards_B.tolist() == [3.0, 2.0]


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="got 2 completions but 1 examples"):
        score(["a", "b"], [Example("p", "")], {"one": const_one}, None)
    with pytest.raises(
        ValueError, match=r"weights are for \['x'\] but reward functions are \['one'\]"
    ):
        Scorer({"one": const_one}, {"x": 1.0})
    with pytest.raises(
        ValueError, match="reward function 'lam' cannot be sent to worker processes"
    ):
        Scorer({"lam": lambda c, e: [1.0] * len(c)}, num_workers=1)
    with pytest.raises(
        ValueError, match="start_method must be one of spawn, forkserver, got 'fork'"
    ):
        Scorer({"one": const_one}, num_workers=1, start_method="fork")
    scorer = Scorer({"one": const_one})
    scorer.close()
    with pytest.raises(RuntimeError, match="Scorer is closed"):
        scorer.score(*batch("a"))


def test_empty_batch() -> None:
    result = score([], [], {"one": const_one}, None)
    assert result.rewards_B.shape == (0,) and result.failures == {"one": 0}


FNS = {
    "len": length_reward,
    "raise": raise_on_bad,
    "hang": hang_on_hang,
    "wrong": wrong_count_on_wrong,
    "die": die_on_die,
}


@pytest.fixture(scope="module")
def pool() -> Iterator[Scorer]:
    with Scorer(FNS, num_workers=2, timeout_s=1.0, chunk_size=2) as scorer:
        yield scorer


def test_workers_match_in_process(pool: Scorer) -> None:
    completions, examples = batch("ab", "abcd", "x", "yz", "q")
    result = pool.score(completions, examples)
    inline = score(completions, examples, FNS, None, chunk_size=2)
    assert result.rewards_B.tolist() == [6.0, 8.0, 5.0, 6.0, 5.0]
    assert inline.rewards_B.tolist() == result.rewards_B.tolist()
    assert all(n == 0 for n in result.failures.values())


def test_hanging_worker_is_killed_and_replaced(
    pool: Scorer, caplog: pytest.LogCaptureFixture
) -> None:
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = pool.score(*batch("hang", "ab", "cd", "ef"))
    assert time.monotonic() - start < 10
    # len [4, 2, 2, 2] + raise 1 + hang [0, 0, 1, 1] + wrong 1 + die 1
    assert result.rewards_B.tolist() == [7.0, 5.0, 6.0, 6.0]
    assert result.failures == {"len": 0, "raise": 0, "hang": 2, "wrong": 0, "die": 0}
    assert (
        "reward 'hang' failed on samples 0:2 (timed out after 1 s (worker killed))" in caplog.text
    )
    again = pool.score(*batch("ab", "cd"))  # the pool recovered
    assert again.rewards_B.tolist() == [6.0, 6.0]


def test_raise_wrong_count_and_dead_worker(pool: Scorer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = pool.score(*batch("bad", "ab", "wrong", "cd", "die", "x"))
    assert "reward 'die' failed on samples 4:6 (worker process died (exit code 3))" in caplog.text
    # len [3, 2, 5, 2, 3, 1]; raise fails 0:2; wrong fails 2:4; die fails 4:6
    assert result.rewards_B.tolist() == [6.0, 5.0, 8.0, 5.0, 6.0, 4.0]
    assert result.failures == {"len": 0, "raise": 2, "hang": 0, "wrong": 2, "die": 2}
    assert pool.score(*batch("a")).rewards_B.tolist() == [5.0]


def test_score_convenience_with_workers() -> None:
    completions, examples = batch("a", "bad", "ccc")
    fns = {"len": length_reward, "raise": raise_on_bad}
    result = score(completions, examples, fns, {"len": 1.0, "raise": 10.0}, num_workers=2)
    # chunk size ceil(3 / 2) = 2: raise fails on samples 0:2 only
    assert result.rewards_B.tolist() == [1.0, 3.0, 13.0]
    assert result.failures == {"len": 0, "raise": 2}


def busy_on_hang(completions: list[str], examples: list[Example]) -> list[float | None]:
    """Spins in Python (no sleep, no I/O) on "hang"; returns at last, so a scorer without a timeout fails the test."""
    if "hang" in completions:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass
    return [1.0] * len(completions)


def exit_on_exit(completions: list[str], examples: list[Example]) -> list[float | None]:
    if "exit" in completions:
        sys.exit(0)
    return [1.0] * len(completions)


@pytest.mark.parametrize("fn", [hang_on_hang, busy_on_hang], ids=["sleeps", "spins"])
def test_in_process_timeout_holds(fn, caplog: pytest.LogCaptureFixture) -> None:
    """num_workers=0: a call past timeout_s is interrupted (SIGALRM) and its chunk gets the fallback, counted."""
    handler = signal.getsignal(signal.SIGALRM)
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = score(*batch("hang", "ab"), {"f": fn}, chunk_size=1, timeout_s=0.5)
    assert result.failures == {"f": 1} and result.rewards_B.tolist() == [0.0, 1.0]
    assert "reward 'f' failed on samples 0:1 (timed out after 0.5 s)" in caplog.text
    assert signal.getsignal(signal.SIGALRM) == handler            # the handler is put back


def test_sys_exit_in_a_reward_is_a_failed_call(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        result = score(*batch("exit", "ab"), {"f": exit_on_exit}, chunk_size=1)
    assert result.failures == {"f": 1} and result.rewards_B.tolist() == [0.0, 1.0]
    assert "(SystemExit: 0)" in caplog.text


def test_a_stop_signal_ends_in_process_scoring_at_once() -> None:
    """SIGTERM while a reward function hangs in-process: the runner's StopSignal interrupts the scorer; no later
    chunk is called, and the batch raises `ScoringStopped` rather than returning fallback rewards."""
    from jaxcore.runtime.runner import StopSignal

    calls = []

    def term_then_hang(completions: list[str], examples: list[Example]) -> list[float | None]:
        calls.append(completions[0])
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        return [1.0] * len(completions)

    with Scorer({"f": term_then_hang}, chunk_size=1, timeout_s=60) as scorer, \
            StopSignal(on_signal=scorer.interrupt) as stop:
        with pytest.raises(ScoringStopped, match="3 of 3 reward jobs not run"):
            scorer.score(*batch("a", "b", "c"))
        with pytest.raises(ScoringStopped):                    # and every later batch
            scorer.score(*batch("d"))
    assert stop.received == signal.SIGTERM and calls == ["a"]


def test_interrupt_ends_worker_scoring_at_once() -> None:
    """With workers, `interrupt` (from a signal handler; here another thread) kills the busy worker: the hung
    chunk and the queued one are abandoned at once (`ScoringStopped`) instead of waiting out timeout_s."""
    with Scorer({"hang": hang_on_hang}, num_workers=1, timeout_s=60, chunk_size=1) as scorer:
        timer = threading.Timer(1.0, scorer.interrupt)
        timer.start()
        try:
            with pytest.raises(ScoringStopped, match="reward jobs not run: the run is stopping"):
                scorer.score(*batch("hang", "ab"))
        finally:
            timer.cancel()


def test_a_reward_or_tool_that_changes_the_working_directory_is_undone(tmp_path, monkeypatch, caplog) -> None:
    """The run's relative paths (model, out_dir, data) keep their meaning. (Before: a reward calling os.chdir made
    the start-up probe's next read of `model.path` fail, and moved later writes.)"""
    from jaxcore.agents.calls import call_in_thread

    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def moving(completions, examples):
        os.chdir(elsewhere)
        return [1.0] * len(completions)

    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        assert score(*batch("a"), {"moving": moving}).failures == {"moving": 0}
        assert Path.cwd() == tmp_path
        assert call_in_thread(lambda: os.chdir(elsewhere), {}, 5.0)[0]
        assert Path.cwd() == tmp_path
    assert "changed the working directory" in caplog.text


def test_a_reward_that_replaces_the_stop_handlers_has_them_put_back(caplog) -> None:
    """A stop signal must still stop the run. (Before: a reward calling signal.signal(SIGINT, SIG_IGN), as some
    libraries do, left Ctrl-C ignored for the rest of the run.)"""
    def own_handler(*_args):
        pass

    def ignoring(completions, examples):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, own_handler)
        return [1.0] * len(completions)

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        assert score(*batch("a"), {"ignoring": ignoring}).failures == {"ignoring": 0}
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert "changed signal handlers" in caplog.text
