"""Sentence-level BLEU reward in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sacrebleu

from jaxcore.rewards.types import Example, map_samples


def bleu_score(completion: str, answer: Any) -> float:
    """``sacrebleu.sentence_bleu(completion.strip(), [str(answer)]).score / 100``.

    Clipped to [0, 1]: sacrebleu can return 100.00000000000004 for a perfect match.
    """
    score = sacrebleu.sentence_bleu(completion.strip(), [str(answer)]).score / 100.0
    return min(1.0, max(0.0, score))


def bleu_reward(completions: Sequence[str], examples: Sequence[Example]) -> list[float | None]:
    """Batched :func:`bleu_score`; ``Example.answer`` is the reference sentence."""
    return map_samples(bleu_score, completions, examples)
