"""Score a batch of completions with several reward functions, robustly.

``rewards_B[i] = nansum_f(weight_f * value_f[i])`` (like TRL): a function that returned None
(or NaN) for a sample is skipped for it, and a sample that every function scored None gets 0.
A function that raises, returns the wrong number of values or a non-numeric / infinite
value, or (with worker processes) runs past ``timeout_s``, gives ``fallback`` for the
samples of the affected chunk only; those are counted in ``failures`` and logged as a
one-line warning naming the function on the ``jaxcore.rewards`` logger. ``per_function`` holds the raw values, NaN where
a function returned None or failed. With ``fallback=None`` failed samples are skipped like
None. ``timeout_s`` holds in every mode: in worker processes (``num_workers > 0``) a late job's worker is
killed; in-process (``num_workers=0``) SIGALRM interrupts the call (`workers.call_with_timeout`; off the main
thread, where no alarm can be set, the functions run in one worker process instead). `Scorer.interrupt` (a
stop signal) ends scoring at once: no chunk not scored yet is called, and `score` raises `ScoringStopped` instead
of returning rewards that are partly fallbacks (a training step built on them would learn from the stop).

A multi-turn rollout's environment instances (`score(..., environments=)`, one per completion) reach the
functions that name an ``environments`` parameter (`takes_environments`), as TRL passes them. Those functions
always run in this process (never pickled), also with worker processes: the instances are live objects of this
process (a game's state, a sandbox or a client connection), which TRL's reward functions read in place, and
which often cannot be pickled; a worker would only see a copy. They get the in-process timeout (SIGALRM), not a
worker's crash isolation. A Scorer may hold no functions at all when the rollout's environments score it (their
`get_reward`, added by `jaxcore.runtime.rollout.with_extra`): every reward is then 0 here.

TRL's trainer keywords reach the functions that take them (`jaxcore.rewards.user_functions.TRLReward`):
``trainer_state`` is `Scorer.trainer_state` (the run keeps it current), and what a call gave ``log_metric`` and
``log_extra`` comes back in `ScoreResult.metrics` and `ScoreResult.columns` (from calls that succeeded).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from jaxcore.rewards.config import RewardsConfig
from jaxcore.rewards.types import Example, Reported, RewardFn, TrainerState
from jaxcore.rewards.workers import STOPPING, Outcome, WorkerPool, alarm_available, call_with_timeout

logger = logging.getLogger("jaxcore.rewards")
FLOAT32_MAX = float(np.finfo(np.float32).max)


def finite_in_float32(x: Any) -> np.ndarray:
    """Whether float64 `x` stays finite cast to float32 (training computes rewards in float32)."""
    with np.errstate(over="ignore"):
        return np.isfinite(np.asarray(x, np.float64).astype(np.float32))


@dataclass
class ScoreResult:
    """Rewards of one batch."""

    rewards_B: np.ndarray  # weighted sum over functions, float32 [B]
    per_function: dict[str, np.ndarray]  # raw values per function (NaN where None/failed) [B]
    failures: dict[str, int]  # per function: samples that got the fallback
    errors: dict[str, str] = field(default_factory=dict)  # per function that failed: its first failure
    metrics: dict[str, list[float]] = field(default_factory=dict)  # TRL's log_metric: every value, by name
    columns: dict[str, list[Any]] = field(default_factory=dict)  # TRL's log_extra: one value per sample (None: none)


def to_values(output: Any, n: int) -> np.ndarray:
    """A reward function's output as float64 [n] (None -> NaN); ValueError saying what is wrong with it otherwise
    (the one guard on what user code returns: a dict, a 0-d array, a string, a wrong count, a bad value)."""
    if isinstance(output, (str, bytes, Mapping)):
        raise ValueError(f"returned a {type(output).__name__}, not a list of {n} values")
    try:
        count = len(output)
    except TypeError:                       # no __len__, or a 0-d numpy array / torch tensor
        raise ValueError(f"returned a {type(output).__name__} with no length (a scalar?), not a list of {n} "
                         "values") from None
    if count != n:
        raise ValueError(f"returned {count} values for {n} samples")
    values = np.full(n, np.nan)
    for i, value in enumerate(output):
        if value is not None:
            values[i] = reward_value(value, i)
    return values


def reward_value(value: Any, sample: int) -> float:
    """One reward from user code as a float (NaN stays NaN: skipped like None); ValueError naming what it was when
    it is not a real number finite in float32 (a string, an infinity, an integer too large for a float, 1e300)."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()                # a 0-d torch tensor or numpy array holding one number (TRL takes it)
    if not isinstance(value, numbers.Real):
        raise ValueError(f"returned {value!r:.60} for sample {sample}; expected a finite number")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"returned an integer of {int(value).bit_length()} bits for sample {sample}, too large "
                         "for a float; expected a finite number") from None
    if math.isinf(number):
        raise ValueError(f"returned {number!r} for sample {sample}; expected a finite number")
    if not finite_in_float32(number):
        raise ValueError(f"returned {number!r} for sample {sample}, beyond float32's range (training computes in "
                         "float32); expected a finite number")
    return number


def takes_environments(fn: RewardFn) -> bool:
    """Whether a reward is to be called with the rollout's environment instances (`environments=`)."""
    return bool(getattr(fn, "takes_environments", False))


def takes_trainer_state(fn: RewardFn) -> bool:
    """Whether a reward is to be called with the run's `TrainerState` (TRL's `trainer_state=`)."""
    return bool(getattr(fn, "takes_trainer_state", False))


class ScoringInterrupted(BaseException):
    """Raised into an in-process reward call by `Scorer.interrupt` (a stop signal)."""


class ScoringStopped(Exception):
    """`Scorer.score` was cut short by `Scorer.interrupt` (a stop signal): some of the batch got no reward, so
    nothing may be computed from its rewards (a training step must drop its epoch, not learn from fallbacks)."""


class Scorer:
    """Long-lived scorer; holds the worker pool between calls. Not thread-safe.

    ``chunk_size`` defaults to the whole batch in-process and to ``ceil(B / num_workers)``
    with workers. ``start_method`` is "spawn" or "forkserver" (never fork: JAX threads).
    Reward functions must be picklable when ``num_workers > 0``.
    """

    def __init__(
        self,
        reward_fns: Mapping[str, RewardFn],
        weights: Mapping[str, float] | None = None,
        *,
        num_workers: int = RewardsConfig.num_workers,
        timeout_s: float = RewardsConfig.timeout_s,
        fallback: float | None = RewardsConfig.fallback,
        chunk_size: int | None = None,
        start_method: str = "spawn",
    ) -> None:
        weights = dict.fromkeys(reward_fns, 1.0) if weights is None else dict(weights)
        if set(weights) != set(reward_fns):
            raise ValueError(
                f"weights are for {sorted(weights)} but reward functions are {sorted(reward_fns)}"
            )
        if num_workers < 0 or timeout_s <= 0 or (chunk_size is not None and chunk_size < 1):
            raise ValueError("need num_workers >= 0, timeout_s > 0 and chunk_size >= 1 (or None)")
        self.reward_fns = dict(reward_fns)
        self.weights = weights
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.fallback = fallback
        self.chunk_size = chunk_size
        pooled = {name: fn for name, fn in self.reward_fns.items() if not takes_environments(fn)}
        self._pool = WorkerPool(pooled, num_workers, start_method) if num_workers > 0 and pooled else None
        if self._pool is None and pooled and not alarm_available():
            try:            # no SIGALRM off the main thread: one worker process enforces the timeout
                self._pool = WorkerPool(pooled, 1, start_method)
            except ValueError as e:
                logger.warning("rewards.timeout_s cannot be enforced off the main thread for unpicklable reward "
                               "functions (%s)", str(e).split(";")[0])
        self._closed = False
        self._interrupted = False
        self._in_call = False
        self.trainer_state = TrainerState()     # TRL's trainer_state= (the run sets its own, kept current)

    def score(self, completions: Sequence[str], examples: Sequence[Example],
              environments: Sequence[Any] | None = None) -> ScoreResult:
        """Score one batch; see the module docstring for the failure rules and for `environments` (a multi-turn
        rollout's instance per completion)."""
        if self._closed:
            raise RuntimeError("Scorer is closed")
        if len(completions) != len(examples):
            raise ValueError(f"got {len(completions)} completions but {len(examples)} examples")
        if environments is not None and len(environments) != len(examples):
            raise ValueError(f"got {len(environments)} environments for {len(examples)} examples")
        completions, examples = list(completions), list(examples)
        size = len(completions)
        width = self.chunk_size or max(1, -(-size // max(self.num_workers, 1)))
        jobs = [
            (name, start, min(start + width, size))
            for name in self.reward_fns
            for start in range(0, size, width)
        ]
        keywords = {name: {"trainer_state": self.trainer_state} if takes_trainer_state(fn) else {}
                    for name, fn in self.reward_fns.items()}
        payloads = [(name, completions[a:b], examples[a:b], keywords[name]) for name, a, b in jobs]
        here = [takes_environments(self.reward_fns[name]) for name, _, _ in jobs]
        outcomes: list[Outcome | None] = [None] * len(jobs)
        if self._pool is not None:
            sent = [i for i, inline in enumerate(here) if not inline]
            for i, outcome in zip(sent, self._pool.run([payloads[i] for i in sent], self.timeout_s)):
                outcomes[i] = outcome
        for i, ((name, c, e, options), (_, a, b)) in enumerate(zip(payloads, jobs)):
            if outcomes[i] is None:
                if here[i] and environments is not None:
                    options = {**options, "environments": list(environments[a:b])}
                outcomes[i] = self._run_inline(functools.partial(self.reward_fns[name], **options), c, e)
        stopped = sum(not ok and output == STOPPING for ok, output in outcomes)
        if stopped:
            raise ScoringStopped(f"{stopped} of {len(jobs)} reward jobs not run: the run is stopping")
        raw = {name: np.full(size, np.nan) for name in self.reward_fns}
        failed = {name: np.zeros(size, dtype=bool) for name in self.reward_fns}
        errors: dict[str, str] = {}
        metrics: dict[str, list[float]] = {}               # what the calls logged (TRL's log_metric, log_extra)
        columns: dict[str, list[Any]] = {}
        for (name, start, stop), (ok, output) in zip(jobs, outcomes, strict=True):
            if ok:
                try:
                    raw[name][start:stop] = to_values(output, stop - start)
                    if isinstance(output, Reported):
                        _collect(metrics, columns, output, name, (start, stop), size)
                    continue
                except ValueError as e:
                    output = str(e)
            failed[name][start:stop] = True
            errors.setdefault(name, str(output))
            logger.warning(
                "reward '%s' failed on samples %d:%d (%s); using fallback %s",
                name,
                start,
                stop,
                output,
                self.fallback,
            )
        result = self._combine(raw, failed, size)
        result.errors, result.metrics, result.columns = errors, metrics, columns
        return result

    def _run_inline(self, fn: Callable[..., Any], completions: list[str], examples: list[Example]) -> Outcome:
        """One in-process call under the timeout; after `interrupt`, none is made."""
        if self._interrupted:
            return False, STOPPING
        try:
            self._in_call = True
            return call_with_timeout(fn, (completions, examples), self.timeout_s)
        except ScoringInterrupted:
            return False, STOPPING
        finally:
            self._in_call = False

    def interrupt(self) -> None:
        """Stop scoring now: the batch being scored, and every later one, raises `ScoringStopped` once its calls
        are abandoned; meant to be called from a SIGTERM/SIGINT handler. A running in-process call is interrupted
        (raised into), and no further call is made."""
        self._interrupted = True
        if self._pool is not None:
            self._pool.interrupt()
        if self._in_call:
            raise ScoringInterrupted

    def _combine(self, raw: dict[str, np.ndarray], failed: dict[str, np.ndarray], size: int) -> ScoreResult:
        if not raw:                     # no functions: the rollout's environments score it (`with_extra`)
            return ScoreResult(np.zeros(size, np.float32), {}, {})
        fill = np.nan if self.fallback is None else self.fallback
        terms = np.stack(
            [self.weights[name] * np.where(failed[name], fill, raw[name]) for name in raw]
        )
        unscored = int(np.isnan(terms).all(axis=0).sum())
        if unscored:
            logger.warning("%d samples have no reward from any function; they get 0", unscored)
        rewards_B = np.nansum(terms, axis=0)
        beyond = ~finite_in_float32(rewards_B) & ~np.isnan(rewards_B)
        if beyond.any():                 # each function's reward is finite in float32, their weighted sum is not
            logger.warning("the weighted sum of the rewards of samples %s is beyond float32's range; clipped to its "
                           "largest value", np.flatnonzero(beyond).tolist())
            rewards_B = np.clip(rewards_B, -FLOAT32_MAX, FLOAT32_MAX)
        return ScoreResult(
            rewards_B=rewards_B.astype(np.float32),
            per_function=raw,
            failures={name: int(mask.sum()) for name, mask in failed.items()},
        )

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
        self._closed = True

    def __enter__(self) -> Scorer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _collect(metrics: dict[str, list[float]], columns: dict[str, list[Any]], output: Reported, name: str,
             samples: tuple[int, int], size: int) -> None:
    """Add what one call on `samples` (start, stop) of a batch of `size` logged: its metrics' values, and its
    columns' values at those samples (a column with another count than the call's samples is left out, warned)."""
    start, stop = samples
    for metric, values in output.metrics.items():
        metrics.setdefault(metric, []).extend(values)
    for column, values in output.columns.items():
        if len(values) != stop - start:
            logger.warning("reward '%s' logged %d values of column %r for %d samples; the column is not logged",
                           name, len(values), column, stop - start)
            continue
        columns.setdefault(column, [None] * size)[start:stop] = list(values)


def score(
    completions: Sequence[str],
    examples: Sequence[Example],
    reward_fns: Mapping[str, RewardFn],
    weights: Mapping[str, float] | None = None,
    **options: Any,
) -> ScoreResult:
    """One-shot :class:`Scorer` (starts and stops workers each call); ``options`` are the Scorer's
    (``num_workers``, ``timeout_s``, ``fallback``, ``chunk_size``, ...)."""
    with Scorer(reward_fns, weights, **options) as scorer:
        return scorer.score(completions, examples)
