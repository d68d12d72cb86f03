"""Grading completions with the shared numeric reward (last `<answer>`, 5% relative tolerance)."""

from __future__ import annotations

from jaxcore.rewards.numeric import numeric_score, parse_number
from jaxcore.rewards.text import last_answer

REL_TOL = 0.05
_CLOSE = "</answer>"


def answered(completion: str) -> bool:
    """True if the last `<answer>` block holds a parseable number."""
    content = last_answer(completion)
    return content is not None and parse_number(content) is not None


def correct(completion: str, answer: float, rel_tol: float = REL_TOL) -> bool:
    """True if the last `<answer>` number is within `rel_tol` of `answer`."""
    return numeric_score(completion, answer, rel_tol=rel_tol) == 1.0


def reasoning_of(completion: str) -> str:
    """The completion up to its last `</answer>` (what SFT teaches; trailing text is dropped)."""
    end = completion.rfind(_CLOSE)
    return (completion[:end + len(_CLOSE)] if end >= 0 else completion).strip()
