"""Core data types shared by rewards, tasks and scoring."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxcore.errors import TaskError  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Example:
    """One prompt, the reference built-in rewards compare against, and the dataset row's other columns."""

    prompt: Any  # text (no chat template applied) or a conversation: [{"role": ..., "content": ...}, ...]
    answer: Any = None  # JSON-serialisable reference (str, number, dict ...); None when the data has none
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False)  # every column but the prompt


RewardFn = Callable[[list[str], list[Example]], list[float | None]]
"""Batched reward: ``fn(completions, examples) -> one float (or None) per completion``."""


@dataclass
class TrainerState:
    """The part of transformers' `TrainerState` a reward function (TRL's `trainer_state=`), a script or a callback
    reads: optimizer steps taken, the run's optimizer steps, passes over the dataset so far and the logged entries.
    A run keeps one current (`jaxcore.runtime.runner`)."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    is_world_process_zero: bool = True


class Reported(list):  # type: ignore[type-arg]
    """A reward function's values with what it reported beside them through TRL's keywords: `metrics`, the values
    it gave `log_metric(name, value)`, and `columns`, those it gave `log_extra(column, values)` (one per sample, for
    the completions table). Pickles with both (a worker process sends it back whole)."""

    metrics: dict[str, list[float]]
    columns: dict[str, list[Any]]

    def __init__(self, values: Any, metrics: dict[str, list[float]], columns: dict[str, list[Any]]) -> None:
        super().__init__(values)
        self.metrics, self.columns = metrics, columns


def map_samples(
    score_one: Callable[[str, Any], float | None],
    completions: Sequence[str],
    examples: Sequence[Example],
) -> list[float | None]:
    """Apply a per-sample ``score_one(completion, answer)`` over a batch."""
    if len(completions) != len(examples):
        raise ValueError(f"got {len(completions)} completions but {len(examples)} examples")
    return [score_one(c, e.answer) for c, e in zip(completions, examples, strict=True)]
