"""Qiu et al.'s evolution strategies for LLM fine-tuning, as their paper describes it: a reference for timing
and learning-curve comparisons with jaxcore's EGGROLL (`jaxcore bench --suite qiu`).

X. Qiu et al., "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning" (2025),
Algorithm 1 (code: github.com/VsonicV/es-at-scale). One iteration with population N, noise scale sigma and
learning rate alpha, written here from the paper's description:

    seeds s_1..s_N drawn from the iteration's seed
    for n = 1..N (one member after another):
        theta += sigma * eps_n          in place, layer by layer, eps_n regenerated from s_n (torch.Generator)
        R_n = mean reward of the member's greedy completions (HF `generate`) of the iteration's prompts
        theta -= sigma * eps_n          in place, the same eps_n regenerated from s_n
    z_n = (R_n - mean R) / (std R + 1e-8)                      (z-scored rewards, population std)
    theta += alpha * (1/N) * sum_n z_n * eps_n                 (each eps_n regenerated from s_n, layer by layer)

The noise is full-rank Gaussian on every parameter (`model.named_parameters()`: embeddings, norms and all, a
tied head once); as in the paper's code the generator is re-seeded with s_n for each parameter tensor, so
eps_n of one tensor is `torch.randn(shape, generator=Generator().manual_seed(s_n))`. No weights are ever
copied: the perturbation is added and removed in place, which in floating point restores theta only up to
rounding (at most about one ulp of |theta| per member and iteration).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

RewardFn = Callable[[list[str]], Sequence[float]]     # completions of the prompts, in order -> one reward each


def member_seeds(population: int, seed: int) -> list[int]:
    """The iteration's N member seeds (integers in [0, 2**30), as the paper's code draws them)."""
    return np.random.default_rng(seed).integers(0, 2**30, size=population, dtype=np.int64).tolist()


def layer_noise(model: Any, member_seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, eps) for every parameter, eps ~ N(0, I) of its shape regenerated from `member_seed`."""
    for param in model.parameters():
        gen = torch.Generator(device=param.device).manual_seed(int(member_seed))
        yield param, torch.randn(param.shape, generator=gen, device=param.device, dtype=param.dtype)


@torch.no_grad()
def add_noise_(model: Any, member_seed: int, scale: float) -> None:
    """theta += scale * eps(member_seed), in place, one parameter tensor at a time."""
    for param, eps in layer_noise(model, member_seed):
        param.add_(eps, alpha=scale)


def z_scores(rewards_N: Sequence[float]) -> np.ndarray:
    """(R - mean) / (std + 1e-8), population std."""
    r = np.asarray(rewards_N, np.float64)
    return (r - r.mean()) / (r.std() + 1e-8)


@torch.no_grad()
def greedy_completions(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    """The prompts' greedy completions with HF `generate` (left padding), special tokens dropped."""
    tokenizer.padding_side = "left"
    batch = tokenizer(list(prompts), return_tensors="pt", padding=True).to(next(model.parameters()).device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


@torch.no_grad()
def es_update_(model: Any, seeds: Sequence[int], z_N: Sequence[float], alpha: float) -> None:
    """theta += alpha * (1/N) * sum_n z_n * eps_n, parameter by parameter, eps_n regenerated from seeds[n]."""
    n = len(seeds)
    for param in model.parameters():
        update = torch.zeros_like(param)
        gen = torch.Generator(device=param.device)
        for member_seed, z in zip(seeds, z_N):
            gen.manual_seed(int(member_seed))
            update.add_(torch.randn(param.shape, generator=gen, device=param.device, dtype=param.dtype), alpha=float(z))
        param.add_(update, alpha=alpha / n)


def qiu_iteration(model: Any, tokenizer: Any, prompts: Sequence[str], reward_fn: RewardFn, *, population: int,
                  sigma: float, alpha: float, max_new_tokens: int, seed: int,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One iteration of Qiu et al.'s Algorithm 1 on the HF `model`, updated in place.

    Each member's reward is the mean of `reward_fn` over the prompts' greedy completions, scored while the
    member's noise is in place (before it is removed). Returns the member seeds, rewards and z-scores, the
    population's mean reward and the iteration's wall time.
    """
    start = time.perf_counter()
    seeds = member_seeds(population, seed)
    rewards = []
    for n, member_seed in enumerate(seeds):
        add_noise_(model, member_seed, sigma)
        completions = greedy_completions(model, tokenizer, prompts, max_new_tokens)
        rewards.append(float(np.mean(reward_fn(completions))))
        add_noise_(model, member_seed, -sigma)
        if progress is not None:
            progress(f"member {n + 1}/{population}: reward {rewards[-1]:.4f} ({time.perf_counter() - start:.1f} s)")
    z = z_scores(rewards)
    es_update_(model, seeds, z, alpha)
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return {"seeds": seeds, "rewards": rewards, "z": z.tolist(), "mean_reward": float(np.mean(rewards)),
            "seconds": time.perf_counter() - start}
