"""A calculator environment written as TRL's docs write one (`reset`, a tool method with type hints and a
Google-style docstring, `get_reward`), and a TRL reward function: the model must call `multiply` with the
question's numbers (a product of three-digit numbers, which a 135M model cannot work out in its head) and then
answer with the tool's result."""

from __future__ import annotations

import re


class CalculatorEnv:
    """One question's calculator: remembers the operands of the model's last call."""

    def reset(self, **kwargs) -> str | None:
        self.a, self.b = int(kwargs["a"]), int(kwargs["b"])
        self.called_with: tuple[int, int] | None = None
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product a * b.
        """
        self.called_with = (int(a), int(b))
        return int(a) * int(b)

    def get_reward(self) -> float:
        """1 when the last call multiplied the question's two numbers (in either order)."""
        return float(self.called_with is not None and sorted(self.called_with) == sorted((self.a, self.b)))


def correct_product(completions, answer, **kwargs):
    """TRL reward: 1 when the last number of the model's final turn (the episode's last message) is the product."""
    rewards = []
    for completion, expected in zip(completions, answer):
        numbers = re.findall(r"-?\d[\d,]*", completion[-1]["content"])
        rewards.append(1.0 if numbers and numbers[-1].replace(",", "") == str(expected) else 0.0)
    return rewards
