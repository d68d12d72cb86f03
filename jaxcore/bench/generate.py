"""generate.jax_over_hf: tokens/s of jaxcore.inference.generate over HF `generate` on the same model and batch.

Greedy decoding of `new_tokens` tokens for `batch` prompts of `prompt_len` tokens, no EOS, so both
produce exactly batch * new_tokens tokens, and neither computes the tokens' log-probs (HF's `output_scores`
is off by default; jaxcore's `logprobs=False`). JAX compile time is excluded by a warm-up call.

Roofline: `generate.jax_roofline` is the whole call (prefill + decode steps); `generate.decode_roofline`
is the decode loop alone, measured as the call's time minus the prefill's (timed on its own: the same
compute-dtype cast and jitted prefill that generate() runs before its decode loop).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxcore.bench import (
    REAL_SHAPES,
    BenchOptions,
    bench_checkpoint,
    interleaved_best_times,
    is_real_size,
    model_summary,
    roofline_entry,
    torch_device,
)
from jaxcore.bench.roofline import peaks_for


def shapes(options: BenchOptions) -> dict[str, int]:
    if is_real_size(options):
        return dict(REAL_SHAPES)
    if options.quick:
        return {"batch": 8, "prompt_len": 16, "new_tokens": 16}
    return {"batch": 32, "prompt_len": 32, "new_tokens": 64}


def prefill_call(model: Any, ids: np.ndarray, mask: np.ndarray, new_tokens: int) -> Any:
    """What generate() does before its decode loop (bucket padding, compute-dtype cast, jitted prefill),
    as a blocking zero-argument call."""
    import jax
    import jax.numpy as jnp

    from jaxcore.inference.generate import bucket_length, in_compute_dtype, pad_left, prefill

    length = bucket_length(ids.shape[1])
    ids_p, mask_p = (jnp.asarray(x) for x in pad_left(ids, mask, length, 0))

    def call() -> Any:
        return jax.block_until_ready(prefill(in_compute_dtype(model), ids_p, mask_p,
                                             cache_length=length + new_tokens))

    return call


def run(options: BenchOptions) -> dict[str, Any]:
    import jax
    import torch

    import jaxcore
    from jaxcore.inference.generate import generate
    from torchref.model import load_reference

    path = bench_checkpoint(options)
    s = shapes(options)
    model = jaxcore.load_hf(path, dtype=options.dtype)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, model.config.vocab_size, (s["batch"], s["prompt_len"])).astype(np.int32)
    mask = np.ones_like(ids)

    def jax_generate():     # no log-probs: HF's generate computes no scores unless asked (output_scores)
        return jax.block_until_ready(generate(model, ids, mask, max_new_tokens=s["new_tokens"], temperature=0.0,
                                              logprobs=False))

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

    # alternated round by round, so that load from other processes on a shared machine hits every side alike
    times = interleaved_best_times({"jax": jax_generate, "prefill": prefill_call(model, ids, mask, s["new_tokens"]),
                                    "hf": hf_generate}, rounds=3)
    jax_s, prefill_s, hf_s = times["jax"], times["prefill"], times["hf"]
    peaks_for(options.dtype, options.quick, refresh=True)      # re-measured next to the timings (max kept)
    tokens = s["batch"] * s["new_tokens"]
    gen_shape = dict(batch=s["batch"], prompt_len=s["prompt_len"], new_tokens=s["new_tokens"])
    agree = float((hf_generate()[:, s["prompt_len"]:].cpu().numpy() == np.asarray(jax_generate().tokens)).mean())
    return {"generate.jax_over_hf": round(hf_s / jax_s, 3),
            "generate.jax_tokens_per_s": round(tokens / jax_s, 1),
            "generate.hf_tokens_per_s": round(tokens / hf_s, 1),
            "generate.greedy_token_agreement": round(agree, 4),
            "generate.jax_roofline": roofline_entry(model, options, jax_s, **gen_shape),
            "generate.prefill_s": prefill_s,
            "generate.decode_roofline": roofline_entry(model, options, jax_s - prefill_s, decode_only=True,
                                                       **gen_shape),
            "generate.shape": {**s, **model_summary(model), "torch_threads": torch.get_num_threads(),
                               "torch_device": device}}
