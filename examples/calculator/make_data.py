"""Write train.jsonl / eval.jsonl: "What is A * B?" (three-digit numbers, disjoint pairs), each prompt a
conversation that shows three exchanges first (a question, the `<tool_call>`, the tool's result, the answer):
SmolLM2 has never seen the call format, and with one demonstration it rarely calls the tool at all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def exchange(a: int, b: int) -> list[dict]:
    """One demonstrated question: the call, the tool's result, the answer."""
    call = f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    return [{"role": "user", "content": f"What is {a} * {b}?"}, {"role": "assistant", "content": call},
            {"role": "tool", "content": str(a * b)}, {"role": "assistant", "content": f"{a} * {b} = {a * b}"}]


DEMO = [*exchange(12, 34), *exchange(57, 81), *exchange(23, 46)]


def rows(pairs: np.ndarray) -> list[dict]:
    return [{"prompt": [*DEMO, {"role": "user", "content": f"What is {a} * {b}?"}], "a": int(a), "b": int(b),
             "answer": int(a) * int(b)} for a, b in pairs]


if __name__ == "__main__":
    pairs = np.random.default_rng(0).integers(100, 1000, (192, 2))
    here = Path(__file__).parent
    for name, chunk in (("train", pairs[:128]), ("eval", pairs[128:])):
        (here / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(chunk)))
