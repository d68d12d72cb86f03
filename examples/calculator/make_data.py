"""Write train.jsonl / eval.jsonl: "What is A * B?" (three-digit numbers, disjoint pairs), each prompt a
conversation that shows one tool call first (the model has never seen the `<tool_call>` format)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
DEMO = [{"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "12 * 34 = 408"}]


def rows(pairs: np.ndarray) -> list[dict]:
    return [{"prompt": [*DEMO, {"role": "user", "content": f"What is {a} * {b}?"}], "a": int(a), "b": int(b),
             "answer": int(a) * int(b)} for a, b in pairs]


if __name__ == "__main__":
    pairs = np.random.default_rng(0).integers(100, 1000, (192, 2))
    here = Path(__file__).parent
    for name, chunk in (("train", pairs[:128]), ("eval", pairs[128:])):
        (here / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(chunk)))
