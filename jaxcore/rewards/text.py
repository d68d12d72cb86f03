"""Small helpers to pull the graded part out of a completion."""

from __future__ import annotations

import re

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_answer(text: str) -> str | None:
    """Stripped content of the last ``<answer>...</answer>`` block, or None."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def first_line(text: str) -> str:
    """First non-empty line of ``text``, stripped ('' if there is none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
