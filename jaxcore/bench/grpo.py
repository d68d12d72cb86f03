"""GRPO benchmark: one optimisation step (forward, backward, AdamW) in torch+HF vs jaxcore's jit'd step.

`run(options)` -> {"grpo.jax_over_torch": torch_time / jax_time, ...}, both measured in this run on
the same batch of completions. `bf16_vs_fp32(...)` trains the same batches in both compute dtypes and
reports how far the bf16 curves drift from the fp32 ones.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from jaxcore.bench import (
    REAL_SHAPES,
    BenchOptions,
    bench_checkpoint,
    device_info,
    interleaved_best_times,
    is_real_size,
    model_summary,
    torch_device,
)
from jaxcore.grpo.advantages import compute_advantages
from jaxcore.grpo.config import GRPOConfig, GRPOOptions
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import GRPOBatch, build_batch

PAD_ID, EOS_ID = 0, 2          # jaxcore.hf.tiny's special tokens


def bench_config(completion_len: int, *, total_steps: int = 1000, **grpo: Any) -> GRPOConfig:
    """The benchmarked job: TRL's defaults and the `grpo` settings, completions of `completion_len` tokens
    (dr_grpo's max_completion_length) and a learning-rate horizon of `total_steps` optimiser steps."""
    cfg = GRPOConfig(grpo=GRPOOptions(**grpo))
    cfg.rollout.max_new_tokens = completion_len
    cfg.train.epochs = max(total_steps // (cfg.grpo.num_iterations * cfg.grpo.steps_per_rollout), 1)
    return cfg


def trl_args(cfg: GRPOConfig) -> SimpleNamespace:
    """The job's loss and step settings under TRL's flat GRPOConfig names, as `torchref.grpo` (a transcription
    of TRL) reads them: the grpo section's, `temperature` and `max_completion_length` (the rollout's)."""
    return SimpleNamespace(**{f.name: getattr(cfg.grpo, f.name) for f in dataclasses.fields(cfg.grpo)},
                           temperature=cfg.rollout.temperature, max_completion_length=cfg.rollout.max_new_tokens)


def synthetic_batch(vocab_size: int, batch_size: int, prompt_len: int, completion_len: int, *,
                    group_size: int = 4, seed: int = 0, shared_prompts: bool = False) -> GRPOBatch:
    """Random rollouts shaped like real ones: left-padded prompts and right-padded completions of
    unequal lengths (odd rows end in EOS, even rows may run to the limit = truncated), group advantages;
    with `shared_prompts` each group's rows share one prompt, as a rollout's do."""
    rng = np.random.default_rng(seed)
    prompt_ids = np.full((batch_size, prompt_len), PAD_ID, np.int32)
    prompt_mask = np.zeros((batch_size, prompt_len), np.int32)
    completion_ids = np.full((batch_size, completion_len), PAD_ID, np.int32)
    completion_mask = np.zeros((batch_size, completion_len), np.int32)
    for row in range(batch_size):
        n_prompt = int(rng.integers(max(1, prompt_len // 2), prompt_len + 1))
        n_done = int(rng.integers(1, completion_len + 1)) if row % 2 else completion_len
        prompt_ids[row, prompt_len - n_prompt:] = rng.integers(3, vocab_size, n_prompt)
        prompt_mask[row, prompt_len - n_prompt:] = 1
        if shared_prompts and row % group_size:
            prompt_ids[row], prompt_mask[row] = prompt_ids[row - 1], prompt_mask[row - 1]
        completion_ids[row, :n_done] = rng.integers(3, vocab_size, n_done)
        if row % 2:
            completion_ids[row, n_done - 1] = EOS_ID
        completion_mask[row, :n_done] = 1
    rewards = rng.normal(size=batch_size).astype(np.float32)
    advantages = np.asarray(compute_advantages(rewards, group_size, "group"))
    return build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, (EOS_ID,))


def torch_step(path: Path, batch: GRPOBatch, cfg: GRPOConfig, dtype: str = "float32") -> Callable[[], None]:
    """One torch step: HF forward, TRL-style loss, backward, global-norm clipping, AdamW. fp32 parameters;
    bf16 compute through autocast when `dtype` is bfloat16 (jaxcore's fp32-master/bf16-compute split);
    eval mode (no dropout, like the jaxcore model); CUDA when available."""
    import contextlib

    import torch

    from torchref.grpo import batch_objective
    from torchref.model import load_reference

    torch.set_num_threads(os.cpu_count() or 1)
    device = torch_device()
    model = load_reference(path).to(device)
    opt, trl = cfg.optimizer, trl_args(cfg)
    # fused=True: transformers' default optimiser ("adamw_torch_fused") on torch >= 2.8
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt.learning_rate, betas=(opt.adam_beta1, opt.adam_beta2),
                                  eps=opt.adam_epsilon, weight_decay=opt.weight_decay, fused=True)

    def compute_context() -> contextlib.AbstractContextManager:
        return torch.autocast(device, dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with compute_context():
            loss, _ = batch_objective(model, batch, trl)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.max_grad_norm)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def jax_step(model: Any, batch: GRPOBatch, cfg: GRPOConfig) -> Callable[[], None]:
    """One jit'd jaxcore step (blocks until the metrics are on the host)."""
    learner = GRPOLearner(model, cfg)
    prepared = learner.prepare(batch)
    return lambda: learner.step(prepared)


def shapes(options: BenchOptions, params: int) -> tuple[int, int, int]:
    """(rows, prompt_len, completion_len) of the benchmarked GRPO batch.

    quick: 4 x (8 + 24) on the tiny model; bench (CPU): 8 x (32 + 96). Real-size presets train on
    item 2's rollout shape, prompt 64 + 256 completion tokens, with rows scaled down as the model grows
    so one step stays a few seconds and fits one 80 GB GPU next to the torch reference (fp32 masters,
    AdamW state and the [rows, 320, vocab] logits): 32 rows below 300M parameters (SmolLM2-135M),
    16 below 1B (Qwen2.5-0.5B), 8 below 3B (Qwen2.5-1.5B), 2 beyond."""
    if options.quick:
        return 4, 8, 24
    if not is_real_size(options):
        return 8, 32, 96
    rows = 32 if params < 3e8 else 16 if params < 1e9 else 8 if params < 3e9 else 2
    return rows, REAL_SHAPES["prompt_len"], REAL_SHAPES["new_tokens"]


def run(options: BenchOptions) -> dict[str, Any]:
    """`grpo.jax_over_torch`: torch step time / jaxcore step time on the same batch and shapes;
    `grpo.jax_mfu`: the jaxcore step's matmul FLOPs per second over the measured peak matmul throughput."""
    import jax.numpy as jnp

    import jaxcore
    from jaxcore.bench import roofline

    path = bench_checkpoint(options)
    model = jaxcore.load_hf(path, dtype=options.dtype)
    shape = roofline.model_shape(model)
    batch_size, prompt_len, completion_len = shapes(options, shape.total_params())
    rounds = 2 if options.quick else 8 if not is_real_size(options) else 4
    batch = synthetic_batch(model.config.vocab_size, batch_size, prompt_len, completion_len)
    cfg = bench_config(completion_len)
    times = interleaved_best_times({"jax": jax_step(model, batch, cfg),
                                    "torch": torch_step(path, batch, cfg, options.dtype)}, rounds)
    work = roofline.train_step(shape, batch_size, prompt_len + completion_len, jnp.dtype(options.dtype).itemsize)
    peaks = roofline.peaks_for(options.dtype, options.quick, refresh=True)   # re-measured next to the timings
    # MFU: step FLOPs per second over the measured peak matmul throughput (the GRPO target's measure)
    jax_entry, torch_entry = (roofline.limit(work, peaks, times[side]) for side in ("jax", "torch"))
    return {"grpo.jax_over_torch": times["torch"] / times["jax"], "grpo.jax_step_s": times["jax"],
            "grpo.torch_step_s": times["torch"],
            "grpo.jax_mfu": jax_entry["mfu"], "grpo.torch_mfu": torch_entry["mfu"],
            "grpo.jax_roofline": jax_entry, "grpo.torch_roofline": torch_entry,
            "grpo.batch": f"{batch_size}x{prompt_len + completion_len}",
            "grpo.model": model_summary(model), "grpo.device": device_info()}


def _train_curves(path: Path, dtype: str, batches: list[GRPOBatch], steps: int, cfg: GRPOConfig
                  ) -> tuple[list[float], list[float]]:
    """Per-step loss and mean completion NLL (measured on each rollout before it is trained on)."""
    import jaxcore

    learner = GRPOLearner(jaxcore.load_hf(path, dtype=dtype), cfg)
    losses, nlls = [], []
    for step in range(steps):
        batch = learner.prepare(batches[step % len(batches)])       # stores old log-probs (mu > 1)
        mask = np.asarray(batch.completion_mask_BL, bool)
        nlls.append(float(-np.asarray(batch.old_logp_BL)[mask].mean()))
        losses.extend(learner.step(batch)["loss"] for _ in range(cfg.grpo.num_iterations))
    return losses, nlls


def bf16_vs_fp32(path: str | Path, *, steps: int = 8, batch_size: int = 8, prompt_len: int = 16,
                 completion_len: int = 48, num_batches: int = 2, learning_rate: float = 1e-4) -> dict[str, Any]:
    """Train the same rollouts with fp32 and bf16 compute (fp32 master weights) and compare the curves.

    GRPO's loss at ratio 1 is a constant of the batch, so the run uses mu = 2 and beta = 0.04 to make the
    loss depend on the weights. Reported deviations: `loss_max_dev`, max |loss_bf16 - loss_fp32| over the
    curve divided by max |loss_fp32|; `nll_max_rel_dev`, the max per-step relative deviation of the
    completions' mean negative log-likelihood (a positive, well-scaled curve).
    """
    from jaxcore.hf.convert import read_hf_config

    path = Path(path)
    vocab = read_hf_config(path)["vocab_size"]
    batches = [synthetic_batch(vocab, batch_size, prompt_len, completion_len, seed=i) for i in range(num_batches)]
    cfg = bench_config(completion_len, loss_type="dapo", beta=0.04, num_iterations=2)
    cfg.optimizer.learning_rate = learning_rate
    loss32, nll32 = _train_curves(path, "float32", batches, steps, cfg)
    loss16, nll16 = _train_curves(path, "bfloat16", batches, steps, cfg)
    loss32_a, loss16_a, nll32_a, nll16_a = map(np.asarray, (loss32, loss16, nll32, nll16))
    return {"loss_fp32": loss32, "loss_bf16": loss16, "nll_fp32": nll32, "nll_bf16": nll16,
            "loss_max_dev": float(np.abs(loss16_a - loss32_a).max() / np.abs(loss32_a).max()),
            "nll_max_rel_dev": float((np.abs(nll16_a - nll32_a) / np.abs(nll32_a)).max()),
            "nll_drop_fp32": float(nll32_a[0] - nll32_a[-1])}
