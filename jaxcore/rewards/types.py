"""Core data types shared by rewards, tasks and scoring."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Example:
    """One prompt and the reference its reward functions need."""

    prompt: str  # text given to the model (no chat template applied)
    answer: Any  # JSON-serialisable reference (str, number, dict ...)


RewardFn = Callable[[list[str], list[Example]], list[float | None]]
"""Batched reward: ``fn(completions, examples) -> one float (or None) per completion``."""


class TaskError(ValueError):
    """A task could not be built or its data is malformed."""


def map_samples(
    score_one: Callable[[str, Any], float | None],
    completions: Sequence[str],
    examples: Sequence[Example],
) -> list[float | None]:
    """Apply a per-sample ``score_one(completion, answer)`` over a batch."""
    if len(completions) != len(examples):
        raise ValueError(f"got {len(completions)} completions but {len(examples)} examples")
    return [score_one(c, e.answer) for c, e in zip(completions, examples, strict=True)]
