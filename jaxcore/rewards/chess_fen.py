"""Chess FEN reward: string similarity to the reference FEN, gated on validity.

``reward = 1 - Levenshtein(pred, ref) / max(len(pred), len(ref))`` if ``pred`` is a valid
FEN, else ``invalid_value`` (default 0.0). A FEN is valid when ``chess.Board(pred)`` does
not raise and each side has exactly one king (python-chess accepts a board-only FEN and
fills in the defaults ``w - - 0 1``). ``pred`` is the content of the last
``<answer>...</answer>`` block if there is one, else the first non-empty line, stripped.
``Example.answer`` is the reference FEN string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chess
from rapidfuzz.distance import Levenshtein

from jaxcore.rewards.text import first_line, last_answer
from jaxcore.rewards.types import Example, map_samples


def extract_fen(completion: str) -> str:
    """The predicted FEN: last ``<answer>`` content if present, else the first line."""
    answer = last_answer(completion)
    return first_line(answer if answer is not None else completion)


def is_valid_fen(fen: str) -> bool:
    """True if python-chess parses ``fen`` and each side has exactly one king."""
    try:
        board = chess.Board(fen)
    except ValueError:
        return False
    return all(len(board.pieces(chess.KING, color)) == 1 for color in chess.COLORS)


def fen_similarity(pred: str, ref: str) -> float:
    """``1 - Levenshtein(pred, ref) / max(len(pred), len(ref))`` (1.0 for two empty strings)."""
    longest = max(len(pred), len(ref))
    if longest == 0:
        return 1.0
    return 1.0 - Levenshtein.distance(pred, ref) / longest


def fen_score(completion: str, answer: Any, invalid_value: float = 0.0) -> float:
    """Similarity of the predicted FEN to ``answer``, or ``invalid_value`` if invalid."""
    pred = extract_fen(completion)
    if not is_valid_fen(pred):
        return invalid_value
    return fen_similarity(pred, str(answer).strip())


def chess_fen_reward(
    completions: Sequence[str], examples: Sequence[Example], *, invalid_value: float = 0.0
) -> list[float | None]:
    """Batched :func:`fen_score`."""
    return map_samples(
        lambda c, a: fen_score(c, a, invalid_value=invalid_value), completions, examples
    )
