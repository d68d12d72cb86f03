"""Held-out evaluation with transformers (torch): greedy generation, then the task's rewards.

The protocol is jaxcore's held-out evaluation (`jaxcore.runtime.evaluation.evaluate`), so that in float32 the two
give the same tokens: a plain-text prompt is encoded with the tokenizer's special tokens (a BOS where the
tokenizer adds one), left-padded; decoding is pure greedy (no processor from the checkpoint's
generation_config.json, such as a repetition penalty); it stops at every EOS id of the tokenizer and
config.json; completions are decoded without special tokens.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from jaxcore.rewards import Example, score


def eos_ids(tokenizer: Any, model_config: Any) -> list[int]:
    """The tokenizer's EOS id and config.json's (one or a list), deduplicated: where generation stops."""
    ids: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(model_config, "eos_token_id", None)):
        if source is not None:
            ids.extend(source if isinstance(source, (list, tuple)) else [source])
    return list(dict.fromkeys(int(i) for i in ids))


def generate_with_transformers(model_dir: str | os.PathLike, prompts: list[str], *, max_new_tokens: int,
                               batch_size: int = 64) -> list[str]:
    """Greedy completions from the HF model in `model_dir` (left padding, EOS-aware)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32).eval()
    eos = eos_ids(tokenizer, model.config)
    # Pure greedy: the checkpoint's generation_config.json (repetition penalty, min length, ...) would otherwise
    # fill every setting not passed here.
    model.generation_config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                               pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=True)
        with torch.no_grad():
            out = model.generate(**batch)
        texts.extend(tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def evaluate_with_transformers(model_dir: str | os.PathLike, examples: list[Example], reward_fns: dict[str, Any],
                               weights: dict[str, float], *, max_new_tokens: int, batch_size: int = 64
                               ) -> dict[str, Any]:
    """Mean reward (and per-function means) of greedy torch generations on `examples`, and every completion."""
    texts = generate_with_transformers(model_dir, [e.prompt for e in examples], max_new_tokens=max_new_tokens,
                                       batch_size=batch_size)
    result = score(texts, examples, reward_fns, weights)
    return {"reward": float(result.rewards_B.mean()),
            **{name: float(np.nanmean(v)) for name, v in result.per_function.items()},
            "samples": [{"prompt": e.prompt, "completion": t} for e, t in list(zip(examples, texts))[:5]],
            "completions": texts}
