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


def map_samples(
    score_one: Callable[[str, Any], float | None],
    completions: Sequence[str],
    examples: Sequence[Example],
) -> list[float | None]:
    """Apply a per-sample ``score_one(completion, answer)`` over a batch."""
    if len(completions) != len(examples):
        raise ValueError(f"got {len(completions)} completions but {len(examples)} examples")
    return [score_one(c, e.answer) for c, e in zip(completions, examples, strict=True)]
