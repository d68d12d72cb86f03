"""Held-out evaluation with transformers (torch): greedy generation, then the task's rewards."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from jaxcore.rewards import Example, score


def generate_with_transformers(model_dir: str | os.PathLike, prompts: list[str], *, max_new_tokens: int,
                               batch_size: int = 64) -> list[str]:
    """Greedy completions from the HF model in `model_dir` (left padding, EOS-aware)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32).eval()
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts.extend(tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def evaluate_with_transformers(model_dir: str | os.PathLike, examples: list[Example], reward_fns: dict[str, Any],
                               weights: dict[str, float], *, max_new_tokens: int, batch_size: int = 64
                               ) -> dict[str, Any]:
    """Mean reward (and per-function means) of greedy torch generations on `examples`."""
    texts = generate_with_transformers(model_dir, [e.prompt for e in examples], max_new_tokens=max_new_tokens,
                                       batch_size=batch_size)
    result = score(texts, examples, reward_fns, weights)
    return {"reward": float(result.rewards_B.mean()),
            **{name: float(np.nanmean(v)) for name, v in result.per_function.items()},
            "samples": [{"prompt": e.prompt, "completion": t} for e, t in list(zip(examples, texts))[:5]]}
