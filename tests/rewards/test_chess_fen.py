"""Chess FEN reward: validity gate, Levenshtein similarity and extraction."""

import pytest

from jaxcore.rewards.chess_fen import chess_fen_reward, extract_fen, fen_score, is_valid_fen
from jaxcore.rewards.types import Example

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"  # 56 chars
AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"  # 58 chars
TWO_WHITE_KINGS = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKKNR w - - 0 1"


def test_exact_fen_scores_one() -> None:
    assert fen_score(AFTER_E4, AFTER_E4) == 1.0


def test_similarity_is_one_minus_normalised_levenshtein() -> None:
    # "8" -> "4P3" (1 substitution + 2 insertions), "PPPPPPPP" -> "PPPP1PPP" (1 substitution),
    # "w" -> "b" (1 substitution): distance 5 over max length 58.
    assert fen_score(START, AFTER_E4) == pytest.approx(1 - 5 / 58, abs=1e-12)
    # a board-only FEN is valid (python-chess fills in "w - - 0 1"): 13 deletions over 56.
    assert fen_score(START.split()[0], START) == pytest.approx(1 - 13 / 56, abs=1e-12)


@pytest.mark.parametrize(
    "fen",
    [
        TWO_WHITE_KINGS,
        "8/8/8/8/8/8/8/K7 w - - 0 1",  # no black king
        "8/8/8/8/8/8/8/8 w - - 0 1",  # no kings at all
        "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP w KQkq - 0 1",  # 7 ranks
        "hello",
        "",
        START + " extra",
    ],
)
def test_invalid_fen_gets_invalid_value(fen: str) -> None:
    assert not is_valid_fen(fen)
    assert fen_score(fen, START) == 0.0
    assert fen_score(fen, START, invalid_value=-1.0) == -1.0


def test_extraction() -> None:
    assert extract_fen(f"{START}\nThat is the position.") == START
    assert extract_fen(f"\n   {START}   \n") == START
    assert extract_fen(f"Let me think.\n<answer>\n{START}\n</answer>") == START
    assert extract_fen(f"<answer>{TWO_WHITE_KINGS}</answer> <answer>{START}</answer>") == START


def test_batched() -> None:
    examples = [Example("p", AFTER_E4)] * 3
    rewards = chess_fen_reward([AFTER_E4, TWO_WHITE_KINGS, "no idea"], examples, invalid_value=-0.5)
    assert rewards == [1.0, -0.5, -0.5]
