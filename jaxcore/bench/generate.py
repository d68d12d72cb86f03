"""generate.jax_over_hf: tokens/s of jaxcore.generate over HF `generate` on the same model and batch.

Greedy decoding of `new_tokens` tokens for `batch` prompts of `prompt_len` tokens, no EOS, so both
produce exactly batch * new_tokens tokens. JAX compile time is excluded by a warm-up call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxcore.bench import (
    REAL_SHAPES,
    BenchOptions,
    bench_checkpoint,
    best_time,
    is_real_size,
    model_summary,
    roofline_entry,
    torch_device,
)


def shapes(options: BenchOptions) -> dict[str, int]:
    if is_real_size(options):
        return dict(REAL_SHAPES)
    if options.quick:
        return {"batch": 8, "prompt_len": 16, "new_tokens": 16}
    return {"batch": 32, "prompt_len": 32, "new_tokens": 64}


def run(options: BenchOptions) -> dict[str, Any]:
    import jax
    import torch

    import jaxcore
    from jaxcore.generate import generate
    from torchref.model import load_reference

    path = bench_checkpoint(options)
    s = shapes(options)
    model = jaxcore.load_hf(path, dtype=options.dtype)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, model.config.vocab_size, (s["batch"], s["prompt_len"])).astype(np.int32)
    mask = np.ones_like(ids)

    def jax_generate():
        return jax.block_until_ready(generate(model, ids, mask, max_new_tokens=s["new_tokens"], temperature=0.0))

    device = torch_device()
    torch_dtype = torch.bfloat16 if options.dtype == "bfloat16" else torch.float32
    hf = load_reference(path, dtype=torch_dtype).to(device)
    ids_t, mask_t = torch.tensor(ids, device=device), torch.tensor(mask, device=device)

    def hf_generate():
        with torch.no_grad():
            out = hf.generate(input_ids=ids_t, attention_mask=mask_t, do_sample=False, max_new_tokens=s["new_tokens"],
                              min_new_tokens=s["new_tokens"], pad_token_id=0, eos_token_id=None)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    jax_s = best_time(jax_generate, repeats=3)
    hf_s = best_time(hf_generate, repeats=3)
    tokens = s["batch"] * s["new_tokens"]
    agree = float((hf_generate()[:, s["prompt_len"]:].cpu().numpy() == np.asarray(jax_generate().tokens)).mean())
    return {"generate.jax_over_hf": round(hf_s / jax_s, 3),
            "generate.jax_tokens_per_s": round(tokens / jax_s, 1),
            "generate.hf_tokens_per_s": round(tokens / hf_s, 1),
            "generate.greedy_token_agreement": round(agree, 4),
            "generate.jax_roofline": roofline_entry(model, options, jax_s, batch=s["batch"],
                                                    prompt_len=s["prompt_len"], new_tokens=s["new_tokens"]),
            "generate.shape": {**s, **model_summary(model), "torch_threads": torch.get_num_threads(),
                               "torch_device": device}}
