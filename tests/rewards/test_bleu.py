"""Sentence BLEU reward in [0, 1]."""

import math

import pytest

from jaxcore.rewards.bleu import bleu_reward, bleu_score
from jaxcore.rewards.types import Example


def test_identical_sentence_scores_one() -> None:
    assert bleu_score("  the cat sat on the mat \n", "the cat sat on the mat") == 1.0


def test_brevity_penalty_only() -> None:
    # every 1..4-gram of "a b c d" is in the reference, so BLEU = BP = exp(1 - 8 / 4)
    assert bleu_score("a b c d", "a b c d e f g h") == pytest.approx(math.exp(-1), abs=1e-9)


def test_no_overlap_and_empty_score_zero() -> None:
    assert bleu_score("x y z", "a b") == 0.0
    assert bleu_score("", "a b") == 0.0


def test_batched() -> None:
    examples = [Example("p", "a b c d e f g h"), Example("p", "hello world")]
    rewards = bleu_reward(["a b c d", "hello world"], examples)
    assert rewards == pytest.approx([math.exp(-1), 1.0], abs=1e-9)
