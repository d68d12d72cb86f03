"""RFT data files: JSON lists of `[question, answer]` (questions) and `[question, answer, reasoning]` (SFT).

Questions come from the seeded `unit_conversion` task of `jaxcore.rewards` (train and valid are the
task's hash-disjoint train/eval partitions), stored without the task's answer-format instruction,
which `torchref.rft.prompts` adds back. Every malformed file raises a one-line `TaskError` naming
the file and the entry index.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jaxcore.errors import UserError, check_text
from jaxcore.rewards.numeric import reference_value
from jaxcore.rewards.tasks import unit_conversion_task
from jaxcore.rewards.types import TaskError
from jaxcore.rewards.units import UNIT_PROMPT

# The task's prompt is "<question> <instruction>"; the instruction is everything after "{target}.".
INSTRUCTION = UNIT_PROMPT.split("{target}.", 1)[1]
SPLITS = {"train": "train", "valid": "eval"}   # our split name -> the task's partition


class Question(NamedTuple):
    question: str
    answer: float


class SFTEntry(NamedTuple):
    question: str
    answer: float
    reasoning: str


def make_split(split: str, n: int, seed: int) -> list[Question]:
    """`n` unit-conversion questions of `split` ("train" or "valid"), deterministic for `seed`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    examples = unit_conversion_task().examples(SPLITS[split], n, seed)
    return [Question(e.prompt.removesuffix(INSTRUCTION), float(e.answer)) for e in examples]


def write_json(path: str | os.PathLike, entries: Sequence[Sequence[Any]]) -> Path:
    """Write a JSON list (one entry per line), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    body = ",\n".join(json.dumps(list(e), ensure_ascii=False) for e in entries)
    tmp.write_text(f"[\n{body}\n]\n" if entries else "[]\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_questions(path: str | os.PathLike) -> list[Question]:
    """`[question, answer]` entries; longer entries (e.g. an SFT file's reasoning) are accepted."""
    return [Question(*_checked(path, i, e, 2, exact=False)[:2]) for i, e in enumerate(_entries(path))]


def load_sft(path: str | os.PathLike) -> list[SFTEntry]:
    """`[question, answer, reasoning]` entries, as written by `torchref rft-datagen`."""
    return [SFTEntry(*_checked(path, i, e, 3, exact=True)) for i, e in enumerate(_entries(path))]


def _entries(path: str | os.PathLike) -> list[Any]:
    file = Path(path)
    if not file.is_file():
        raise TaskError(f"{path}: no such file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise TaskError(f"{path}: not UTF-8 text ({err.reason})") from err
    except json.JSONDecodeError as err:
        raise TaskError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from err
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of entries, got {type(data).__name__}")
    if not data:
        raise TaskError(f"{path}: no entries")
    return data


def _checked(path: str | os.PathLike, index: int, entry: Any, width: int, *, exact: bool) -> tuple:
    where = f"{path}: entry [{index}]"
    shape = "[question, answer, reasoning]" if width == 3 else "[question, answer]"
    if not isinstance(entry, list) or len(entry) < width or (exact and len(entry) != width):
        got = f"{len(entry)} items" if isinstance(entry, list) else type(entry).__name__
        raise TaskError(f"{where}: expected {shape}, got {got}")
    question, answer, *rest = entry[:width]
    if not isinstance(question, str) or not question.strip():
        raise TaskError(f"{where}: the question must be a non-empty string")
    try:
        value = reference_value(answer)
    except ValueError:
        raise TaskError(f"{where}: the answer must be a number, got {answer!r}") from None
    if not math.isfinite(value):
        raise TaskError(f"{where}: the answer must be finite, got {answer!r}")
    if rest and (not isinstance(rest[0], str) or not rest[0].strip()):
        raise TaskError(f"{where}: the reasoning must be a non-empty string")
    for text in (question, *rest):
        try:
            check_text(text, where)
        except UserError as err:
            raise TaskError(str(err)) from None
    return (question, value, *rest)
