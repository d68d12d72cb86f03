"""Countdown reward, following Qiu et al. 2025 (arXiv:2509.24372).

``reward = 0.1 * format_reward + answer_reward``, as in the paper's code
(github.com/VsonicV/es-fine-tuning-paper, ``countdown/countdown_task.py``):

* format_reward: the prompt ends with ``<think>``, so ``think_prefix`` is prepended to the
  completion first. 1.0 if the text is exactly ``<think>...</think>\\n<answer>...</answer>``;
  otherwise 0.1 if a ``<think>...</think>`` block is present plus 0.5 if an
  ``<answer>...</answer>`` block is present.
* answer_reward: 1.0 if the expression in the last ``<answer>`` block uses only integers,
  ``+ - * /`` and parentheses, uses the given numbers exactly once (as a multiset), and
  evaluates to the target within 1e-5; else 0.0. The expression is checked with ``ast``
  against a node whitelist and evaluated exactly with ``Fraction`` (never ``eval``).
  Unary minus is accepted, as in the paper's ``eval``-based check.

``Example.answer`` is ``{"numbers": [int, ...], "target": int}``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import partial
from typing import Any

from jaxcore.rewards.text import last_answer
from jaxcore.rewards.types import Example, map_samples

FORMAT_WEIGHT = 0.1
MAX_EXPRESSION_CHARS = 1000

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_FULL_RE = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
_ALLOWED_CHARS_RE = re.compile(r"[0-9+\-*/()\s]+")
_BINARY_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
_UNARY_OPS = (ast.UAdd, ast.USub)


def format_score(
    completion: str, think_prefix: str = "<think>", end_token: str | None = None
) -> float:
    """The paper's format reward in {0, 0.1, 0.5, 0.6, 1}."""
    text = think_prefix + completion
    if end_token and text.endswith(end_token):
        text = text[: -len(end_token)]
    if _FULL_RE.match(text):
        return 1.0
    return 0.1 * bool(_THINK_RE.search(text)) + 0.5 * bool(_ANSWER_RE.search(text))


def parse_expression(expr: str) -> tuple[list[int], Fraction] | None:
    """Sorted integer literals used by ``expr`` and its exact value, or None if not allowed.

    None for anything outside integers, ``+ - * /``, unary ``+ -`` and parentheses, for
    syntax errors, for division by zero and for expressions too long or deep to evaluate.
    """
    if len(expr) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS_RE.fullmatch(expr):
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return None
            numbers.append(node.value)
        elif not isinstance(
            node, (ast.Expression, ast.BinOp, ast.UnaryOp, *_BINARY_OPS, *_UNARY_OPS)
        ):
            return None
    try:
        return sorted(numbers), _evaluate(tree.body)
    except (ZeroDivisionError, RecursionError):
        return None


def _evaluate(node: ast.expr) -> Fraction:
    """Exact value of an already whitelisted expression tree."""
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.BinOp)
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    return left / right


def unpack_answer(answer: Any) -> tuple[list[int], float]:
    """``(numbers, target)`` from a countdown ``Example.answer``."""
    if not isinstance(answer, dict) or "numbers" not in answer or "target" not in answer:
        raise ValueError(
            f"countdown answer must be a dict with 'numbers' and 'target', got {answer!r}"
        )
    return [int(n) for n in answer["numbers"]], float(answer["target"])


def answer_score(completion: str, answer: Any) -> float:
    """1.0 if the last ``<answer>`` expression solves the puzzle exactly, else 0.0."""
    numbers, target = unpack_answer(answer)
    expr = last_answer(completion)
    parsed = parse_expression(expr) if expr else None
    if parsed is None:
        return 0.0
    used, value = parsed
    if used != sorted(numbers):
        return 0.0
    return 1.0 if abs(float(value) - target) < 1e-5 else 0.0


def countdown_format_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    think_prefix: str = "<think>",
    end_token: str | None = None,
) -> list[float | None]:
    """Batched :func:`format_score` (the answer is not needed)."""
    score = partial(format_score, think_prefix=think_prefix, end_token=end_token)
    return map_samples(lambda c, _answer: score(c), completions, examples)


def countdown_answer_reward(
    completions: Sequence[str], examples: Sequence[Example]
) -> list[float | None]:
    """Batched :func:`answer_score`."""
    return map_samples(answer_score, completions, examples)


def countdown_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    think_prefix: str = "<think>",
    end_token: str | None = None,
) -> list[float | None]:
    """Paper reward: ``0.1 * format_reward + answer_reward`` per completion."""

    def score_one(completion: str, answer: Any) -> float:
        fmt = format_score(completion, think_prefix=think_prefix, end_token=end_token)
        return FORMAT_WEIGHT * fmt + answer_score(completion, answer)

    return map_samples(score_one, completions, examples)
