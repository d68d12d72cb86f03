"""Tasks: examples for a split plus the reward functions that grade them.

Procedural tasks draw examples from a seeded generator and keep train and eval disjoint by
hash-partitioning the prompt space: a prompt belongs to ``eval`` iff
``sha256(prompt)`` maps below ``eval_fraction``. This holds for every seed, so no eval prompt
ever appears in any train set. Examples within one split are drawn with replacement, so a
small prompt space (e.g. 1-digit addition) can repeat prompts.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from jaxcore.rewards.chess_fen import chess_fen_reward
from jaxcore.rewards.countdown import (
    FORMAT_WEIGHT,
    countdown_answer_reward,
    countdown_format_reward,
)
from jaxcore.rewards.exact_match import digit_match_reward, exact_match_reward
from jaxcore.rewards.generators import (
    CountdownSource,
    addition_example,
    chess_example,
    countdown_example,
)
from jaxcore.rewards.numeric import numeric_reward
from jaxcore.rewards.types import Example, RewardFn, TaskError
from jaxcore.rewards.units import unit_conversion_example

SPLITS = ("train", "eval")
Generator = Callable[[random.Random], Example]


class Task(Protocol):
    """What the trainer needs from a task (read-only attributes plus ``examples``)."""

    @property
    def name(self) -> str: ...

    @property
    def reward_fns(self) -> dict[str, RewardFn]: ...

    @property
    def reward_weights(self) -> dict[str, float]: ...

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` examples of ``split`` ("train" or "eval"), deterministic for ``seed``."""
        ...

    def num_examples(self, split: str) -> int | None:
        """How many examples ``split`` holds (a dataset's size), or None when any number can be drawn (a
        generator): evaluation then uses at most that many. A dataset task holds its train rows in order in
        ``train``, which training walks in passes (`jaxcore.runtime.runner.epoch_rows`)."""
        ...


def check_split(split: str, n: int) -> None:
    """Raise ValueError for an unknown split or a negative count."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"number of examples must be >= 0, got {n}")


def in_eval_partition(prompt: str, eval_fraction: float) -> bool:
    """True if ``prompt`` falls in the eval part of the hash partition."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < eval_fraction


@dataclass(frozen=True)
class ProceduralTask:
    """A task whose examples come from a seeded generator."""

    name: str
    generate: Generator
    reward_fns: dict[str, RewardFn]
    reward_weights: dict[str, float]
    eval_fraction: float = 0.1
    max_draws_per_example: int = 1000

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(
                f"{self.name}: eval_fraction must be in (0, 1), got {self.eval_fraction}"
            )

    def num_examples(self, split: str) -> None:
        """None: a generator draws as many examples as asked."""
        check_split(split, 0)
        return None

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """Draw until ``n`` examples of ``split``'s partition are found."""
        check_split(split, n)
        rng = random.Random(f"{self.name}/{split}/{seed}")
        want_eval = split == "eval"
        out: list[Example] = []
        draws = 0
        while len(out) < n:
            if draws == n * self.max_draws_per_example:
                raise TaskError(
                    f"{self.name}: found only {len(out)} of {n} {split} examples in {draws} "
                    "draws; the prompt space is too small for this eval_fraction"
                )
            draws += 1
            example = self.generate(rng)
            if in_eval_partition(example.prompt, self.eval_fraction) == want_eval:
                out.append(example)
        return out


def addition_task(
    digits: int = 2, digit_match_weight: float = 0.0, eval_fraction: float = 0.1
) -> ProceduralTask:
    """``"12+34="`` -> ``"46"``; exact match, plus digit_match if its weight is > 0."""
    addition_example(random.Random(0), digits)  # validate options now
    fns: dict[str, RewardFn] = {"exact_match": exact_match_reward}
    weights = {"exact_match": 1.0}
    if digit_match_weight > 0:
        fns["digit_match"] = digit_match_reward
        weights["digit_match"] = digit_match_weight
    return ProceduralTask(
        name="addition",
        generate=partial(addition_example, digits=digits),
        reward_fns=fns,
        reward_weights=weights,
        eval_fraction=eval_fraction,
    )


def countdown_task(
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 100,
    max_target: int = 100,
    source: CountdownSource = "own",
    eval_fraction: float = 0.1,
) -> ProceduralTask:
    """Countdown; reward ``0.1 * countdown_format + 1.0 * countdown_answer`` (the paper's)."""
    generate = partial(
        countdown_example,
        min_numbers=min_numbers,
        max_numbers=max_numbers,
        max_number=max_number,
        max_target=max_target,
        source=source,
    )
    generate(random.Random(0))  # validate options now
    return ProceduralTask(
        name="countdown",
        generate=generate,
        reward_fns={
            "countdown_format": countdown_format_reward,
            "countdown_answer": countdown_answer_reward,
        },
        reward_weights={"countdown_format": FORMAT_WEIGHT, "countdown_answer": 1.0},
        eval_fraction=eval_fraction,
    )


def chess_fen_task(
    min_plies: int = 4, max_plies: int = 20, invalid_value: float = 0.0, eval_fraction: float = 0.1
) -> ProceduralTask:
    """SAN move list -> FEN; reward :func:`~jaxcore.rewards.chess_fen.chess_fen_reward`."""
    generate = partial(chess_example, min_plies=min_plies, max_plies=max_plies)
    generate(random.Random(0))  # validate options now
    reward: RewardFn = partial(chess_fen_reward, invalid_value=invalid_value)
    return ProceduralTask(
        name="chess_fen",
        generate=generate,
        reward_fns={"chess_fen": reward},
        reward_weights={"chess_fen": 1.0},
        eval_fraction=eval_fraction,
    )


def unit_conversion_task(rel_tol: float = 0.05, eval_fraction: float = 0.1) -> ProceduralTask:
    """Questions like "Convert 3.5 kilometers to meters."; reward :func:`numeric_reward`."""
    reward: RewardFn = partial(numeric_reward, rel_tol=rel_tol)
    return ProceduralTask(
        name="unit_conversion",
        generate=unit_conversion_example,
        reward_fns={"numeric": reward},
        reward_weights={"numeric": 1.0},
        eval_fraction=eval_fraction,
    )
