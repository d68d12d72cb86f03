"""The `task:` and `rewards:` sections of a job config: which task draws the prompts, and which reward
functions score the completions (declared once here; the ES and GRPO job configs compose them)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from annotated_types import Ge, Gt


@dataclasses.dataclass
class TaskConfig:
    """The `task:` section."""

    name: str = "addition"              # see jaxcore.rewards.registry.TASKS
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RewardsConfig:
    """The `rewards:` section. `num_workers`, `timeout_s` and `fallback` are also the `Scorer`'s defaults. (The
    ranges are checked with the job config that holds the section: `jaxcore.config.schema.check`.)"""

    # Replace the task's rewards: "file.py:fn", "package.module:fn" (TRL's signature), "model:DIR" (a local
    # sequence-classification reward model) or a built-in name; weights default to 1.0 each.
    functions: list[str] = dataclasses.field(default_factory=list)
    weights: list[float] | None = None
    num_workers: Annotated[int, Ge(0)] = 0      # >0: score in a process pool
    timeout_s: Annotated[float, Gt(0)] = 30.0
    fallback: float = 0.0               # value given to samples whose reward function failed
