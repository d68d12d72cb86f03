"""Seeded problem generators: ``generate(rng) -> Example`` for the procedural tasks."""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Literal

import chess

from jaxcore.rewards.types import Example

COUNTDOWN_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer.\n"
    "Using the numbers [{numbers}], create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>.\n"
    "Let me solve this step by step.\n<think>"
)
"""Prompt of Qiu et al. 2025 (their data file joins these sentences without newlines)."""

CHESS_PROMPT = (
    "Starting from the standard chess starting position, these moves are played:\n"
    "{moves}\n"
    "Give the FEN of the resulting position. Answer with the FEN string only, on one line."
)

CountdownSource = Literal["own", "reasoning_gym"]

_OPS: dict[str, Callable[[Fraction, Fraction], Fraction]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}
_MAX_TRIES = 1000


def addition_example(rng: random.Random, digits: int = 2) -> Example:
    """``"12+34="`` -> ``"46"``, both operands with exactly ``digits`` digits (0-9 for 1)."""
    if digits < 1:
        raise ValueError(f"addition: digits must be >= 1, got {digits}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    a, b = rng.randint(low, 10**digits - 1), rng.randint(low, 10**digits - 1)
    return Example(prompt=f"{a}+{b}=", answer=str(a + b))


def countdown_prompt(numbers: list[int], target: int) -> str:
    """The countdown prompt for one puzzle."""
    return COUNTDOWN_PROMPT.format(numbers=", ".join(map(str, numbers)), target=target)


def countdown_example(
    rng: random.Random,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 100,
    max_target: int = 100,
    source: CountdownSource = "own",
) -> Example:
    """A countdown puzzle with numbers in [1, max_number] and a target in [1, max_target].

    ``answer`` is ``{"numbers", "target", "solution"}``; ``solution`` is one valid expression.
    """
    if not 2 <= min_numbers <= max_numbers or max_number < 1 or max_target < 1:
        raise ValueError(
            "countdown: need 2 <= min_numbers <= max_numbers, max_number >= 1, max_target >= 1"
        )
    if source == "own":
        draw = _own_countdown
    elif source == "reasoning_gym":
        draw = _reasoning_gym_countdown
    else:
        raise ValueError(f"countdown: source must be 'own' or 'reasoning_gym', got {source!r}")
    for _ in range(_MAX_TRIES):
        found = draw(rng, min_numbers, max_numbers, max_number, max_target)
        if found is not None:
            numbers, target, solution = found
            answer = {"numbers": numbers, "target": target, "solution": solution}
            return Example(prompt=countdown_prompt(numbers, target), answer=answer)
    raise RuntimeError(f"countdown: no puzzle with a target <= {max_target} in {_MAX_TRIES} tries")


def _own_countdown(
    rng: random.Random, min_numbers: int, max_numbers: int, max_number: int, max_target: int
) -> tuple[list[int], int, str] | None:
    """Random numbers combined by a random expression tree; None if the target is unusable."""
    numbers = [rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers))]
    terms = [(str(n), Fraction(n)) for n in numbers]
    while len(terms) > 1:
        i, j = rng.sample(range(len(terms)), 2)
        (left, a), (right, b) = terms[i], terms[j]
        op = rng.choice("+-*" if b == 0 else "+-*/")
        rest = [t for k, t in enumerate(terms) if k not in (i, j)]
        terms = [*rest, (f"({left} {op} {right})", _OPS[op](a, b))]
    expr, value = terms[0]
    if value.denominator != 1 or not 1 <= value <= max_target:
        return None
    return numbers, int(value), expr[1:-1]


def _reasoning_gym_countdown(
    rng: random.Random, min_numbers: int, max_numbers: int, max_number: int, max_target: int
) -> tuple[list[int], int, str] | None:
    """One puzzle from reasoning-gym's countdown dataset, seeded from ``rng``."""
    import reasoning_gym  # slow import, only needed for this source

    dataset = reasoning_gym.create_dataset(
        "countdown",
        seed=rng.randrange(2**31),
        size=1,
        min_numbers=min_numbers,
        max_numbers=max_numbers,
        min_value=1,
        max_value=max_number,
        min_target=1,
        max_target=max_target,
    )
    try:
        meta = dataset[0]["metadata"]
    except ValueError:  # reasoning-gym gives up after 100 attempts
        return None
    return [int(n) for n in meta["numbers"]], int(meta["target"]), str(meta["expression"])


def chess_example(rng: random.Random, min_plies: int = 4, max_plies: int = 20) -> Example:
    """A position after random legal moves from the start; answer is ``board.fen()``.

    The game stops early at checkmate or stalemate.
    """
    if not 1 <= min_plies <= max_plies:
        raise ValueError(f"chess: need 1 <= min_plies <= max_plies, got {min_plies}, {max_plies}")
    board = chess.Board()
    for _ in range(rng.randint(min_plies, max_plies)):
        moves = list(board.legal_moves)
        if not moves:
            break
        board.push(rng.choice(moves))
    moves_san = chess.Board().variation_san(board.move_stack)
    return Example(prompt=CHESS_PROMPT.format(moves=moves_san), answer=board.fen())
