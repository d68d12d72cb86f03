"""Tools and an environment written as TRL's docs write them (type hints, Google-style docstrings, `reset`,
tool methods, `get_reward`), used unchanged by the agent tests; plus tools that fail in each way a tool can."""

from __future__ import annotations

import os
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of a and b.
    """
    return a + b


async def async_add(a: int, b: int) -> int:
    """Add two integers, as a coroutine function (TRL accepts async tools).

    Args:
        a: The first integer.
        b: The second integer.
    """
    import asyncio

    await asyncio.sleep(0)
    return a + b


class Untextable:
    def __str__(self) -> str:
        raise ValueError("no text for this result")


def untextable(x: int) -> Untextable:
    """A tool whose result cannot be turned into text.

    Args:
        x: Any integer.
    """
    return Untextable()


def crash(x: int) -> int:
    """A tool that raises.

    Args:
        x: Any integer.
    """
    raise RuntimeError(f"tool broke on {x}")


def hang(x: int) -> int:
    """A tool that never returns.

    Args:
        x: Any integer.
    """
    time.sleep(3600)
    return x


def die(x: int) -> int:
    """A tool that kills its process.

    Args:
        x: Any integer.
    """
    os._exit(3)


class IncrementEnv:
    """TRL's documentation example: a counter the model increments."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        return " The counter starts at 0."

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter)


def said_done(completions, **kwargs):
    """A TRL reward function: 1 when the episode ends saying done (its last message; a text completion's end)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.rstrip().endswith("done") else 0.0 for t in texts]


def counted(environments, **kwargs):
    """A TRL reward function reading the episodes' environments (TRL's `environments=`): each one's counter."""
    return [float(env.counter) for env in environments]


def huge(x: int) -> str:
    """A tool whose result is 20 MB of text.

    Args:
        x: Any integer.
    """
    return "7" * 20_000_000
