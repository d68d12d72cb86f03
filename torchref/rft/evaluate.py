"""Accuracy (last `<answer>` within 5%) and answer rate (a parseable `<answer>`) on a question set."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from torchref.rft.data import Question
from torchref.rft.engines import Engine, sample_batched
from torchref.rft.grading import answered, correct


def evaluate(engine: Engine, questions: Sequence[Question], *, samples: int = 1, batch_size: int = 32,
             micro_batch_size: int = 64, chunk_size: int = 8, progress: bool = True) -> dict[str, Any]:
    """Metrics over every completion (`samples` per question) plus one record per completion."""
    from tqdm import tqdm

    records: list[dict[str, Any]] = []
    batches = range(0, len(questions), batch_size)
    for first in tqdm(batches, desc="rft-eval", unit="batch", file=sys.stderr, disable=not progress):
        batch = questions[first:first + batch_size]
        outputs = sample_batched(engine, [q.question for q in batch], samples,
                                 micro_batch_size=micro_batch_size, chunk_size=chunk_size)
        for question, generated in zip(batch, outputs):
            records.extend({"question": question.question, "answer": question.answer, "completion": text,
                            "correct": correct(text, question.answer), "answered": answered(text)}
                           for text in generated.texts)
    n = max(len(records), 1)
    metrics = {"questions": len(questions), "completions": len(records),
               "accuracy": sum(r["correct"] for r in records) / n,
               "answer_rate": sum(r["answered"] for r in records) / n}
    return {"metrics": metrics, "records": records}


def format_table(metrics: dict[str, Any]) -> str:
    """A two-column text table of the metrics (floats with 4 decimals)."""
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    key_width, value_width = max(len(k) for k, _ in rows), max(len(v) for _, v in rows)
    border = f"+{'-' * (key_width + 2)}+{'-' * (value_width + 2)}+"
    body = [f"| {k:<{key_width}} | {v:>{value_width}} |" for k, v in rows]
    return "\n".join([border, *body, border])
