"""jaxcore's asynchronous-GRPO loss against TRL 1.16's own `AsyncGRPOTrainer.compute_loss`, called on the same
per-token log-probs: TRL's method runs unchanged on a stand-in trainer (one rank, its accelerator's reduce and
gather the identity) whose model returns the given log-probs over one packed row, so the loss, its gradient with
respect to the log-probs and every metric are TRL's own numbers."""

from __future__ import annotations

import os
import types
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcore.grpo.async_loss import async_grpo_loss, staleness_metrics

torch = pytest.importorskip("torch")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trainer_module = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer")


def trl_loss(logp_BT: np.ndarray, sampler_logp_BT: np.ndarray, advantages_B: np.ndarray, mask_BT: np.ndarray, *,
             epsilon: float, epsilon_high: float | None, accumulation_steps: int = 1, world_size: int = 1,
             num_tokens: float | None = None, entropy_BT: np.ndarray | None = None, dtype=torch.float32):
    """TRL's `compute_loss` on one rank holding these rows: (loss, d loss / d logp [B, T], its metrics)."""
    B, T = mask_BT.shape
    selected = np.flatnonzero(mask_BT.reshape(-1))
    flat_logp = torch.tensor(np.asarray(logp_BT, np.float32).reshape(1, -1), dtype=dtype, requires_grad=True)
    entropy = torch.tensor(np.zeros((1, B * T), np.float32) if entropy_BT is None else entropy_BT.reshape(1, -1))

    def model(**kwargs):                                   # the packed forward's output over the one row
        return types.SimpleNamespace(log_probs=flat_logp, entropy=entropy)

    def row(values, kind=torch.float32):
        return torch.as_tensor(np.asarray(values)).to(kind)[None]

    tokens = float(len(selected) if num_tokens is None else num_tokens)
    inputs = {
        "attention_mask": torch.ones(1, B * T, dtype=torch.long),
        **{key: torch.zeros(1, B * T, dtype=torch.long) for key in ("input_ids", "position_ids", "shift_labels")},
        "token_index": row(selected, torch.long),
        "old_log_probs": row(np.asarray(sampler_logp_BT, np.float32).reshape(-1)[selected]),
        "advantages": row(np.repeat(np.asarray(advantages_B, np.float32), T)[selected]),
        "segment_id": row(selected // T, torch.long),
        **{key: torch.zeros(1, 1, dtype=torch.long) for key in ("tree_kv_index", "tree_cu_seqlens_q",
                                                                 "tree_cu_seqlens_k")},
        "tree_max_seqlens": torch.tensor([[B * T, B * T]]),
        "global_n_tokens": torch.tensor([tokens]), "global_n_forward_tokens": torch.tensor([float(B * T)]),
        "mean_seq_len": torch.tensor([float(T)]),
    }
    metrics = defaultdict(list)
    stand_in = types.SimpleNamespace(
        epsilon_low=epsilon, epsilon_high=epsilon if epsilon_high is None else epsilon_high, aux_loss_enabled=False,
        accelerator=types.SimpleNamespace(num_processes=world_size, reduce=lambda t, reduction: t,
                                          gather=lambda t: t.reshape(-1)),
        current_gradient_accumulation_steps=accumulation_steps, _metrics={"train": metrics},
        _step_forward_tokens=0.0, _step_trained_tokens=0.0, _step_seq_len_weighted=0.0, _step_samples=0.0,
        _step_forward_s=0.0)
    loss = trainer_module.AsyncGRPOTrainer.compute_loss(stand_in, model, inputs)
    loss.backward()
    grad = flat_logp.grad.float().numpy().reshape(B, T)
    return float(loss.detach()), grad, {k: v[-1] for k, v in metrics.items()}


def batch(seed: int, B: int = 6, T: int = 9, spread: float = 0.4, empty_row: bool = True):
    """Policy and sampler log-probs apart by N(0, spread) (so both clips are hit), advantages of both signs, a
    mask with rows of different lengths (one without tokens), and junk at the masked positions."""
    rng = np.random.default_rng(seed)
    sampler = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    logp = (sampler + rng.normal(0, spread, (B, T))).astype(np.float32)
    lengths = rng.integers(1, T + 1, B)
    if empty_row:
        lengths[2] = 0
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    mask[0, 0] = 0.0                                         # a hole at the start (a tool result, a prompt token)
    logp = np.where(mask > 0, logp, np.float32(-1e30) if seed % 2 else np.float32(80.0))
    advantages = rng.normal(0, 1, B).astype(np.float32)
    return logp, sampler, advantages, mask


def ours(logp, sampler, advantages, mask, **kwargs):
    def loss_fn(lp):
        return async_grpo_loss(lp, jnp.asarray(sampler), jnp.asarray(advantages), jnp.asarray(mask), **kwargs)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(logp))
    return float(loss), np.asarray(grad, np.float32), {k: float(v) for k, v in metrics.items()}


TRL_METRICS = ("ratio", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
               "clip_ratio/low_min", "clip_ratio/high_max")


@pytest.mark.parametrize("epsilon, epsilon_high", [(0.2, None), (0.2, 0.28), (0.05, 0.05), (0.3, 0.1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_gradient_and_metrics_equal_trls_in_float32(seed, epsilon, epsilon_high):
    logp, sampler, advantages, mask = batch(seed)
    theirs = trl_loss(logp, sampler, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high)
    mine = ours(logp, sampler, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high)
    assert mine[0] == pytest.approx(theirs[0], rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(mine[1], theirs[1], rtol=1e-6, atol=1e-8)
    assert set(TRL_METRICS) <= set(theirs[2]) and set(TRL_METRICS) <= set(mine[2])
    for key in TRL_METRICS:
        assert mine[2][key] == pytest.approx(theirs[2][key], rel=1e-6, abs=1e-7), key
    assert theirs[2]["clip_ratio/region_mean"] > 0           # the clipped branch is exercised
    assert np.all(mine[1][mask == 0] == 0)                    # junk at masked positions reaches nothing


def test_both_clips_are_hit_and_the_clip_metrics_are_not_trivial():
    logp, sampler, advantages, mask = batch(0, B=16, T=12, spread=0.6)
    theirs = trl_loss(logp, sampler, advantages, mask, epsilon=0.2, epsilon_high=0.28)
    mine = ours(logp, sampler, advantages, mask, epsilon=0.2, epsilon_high=0.28)
    assert theirs[2]["clip_ratio/low_mean"] > 0 and theirs[2]["clip_ratio/high_mean"] > 0
    assert theirs[2]["clip_ratio/high_max"] > theirs[2]["clip_ratio/high_mean"]
    for key in TRL_METRICS:
        assert mine[2][key] == pytest.approx(theirs[2][key], rel=1e-6), key


@pytest.mark.parametrize("accumulation_steps, num_tokens", [(1, None), (4, None), (2, 100.0)])
def test_accumulation_and_the_global_token_count_equal_trls(accumulation_steps, num_tokens):
    logp, sampler, advantages, mask = batch(3)
    kwargs = dict(epsilon=0.2, epsilon_high=0.28, accumulation_steps=accumulation_steps, num_tokens=num_tokens)
    theirs = trl_loss(logp, sampler, advantages, mask, **kwargs)
    mine = ours(logp, sampler, advantages, mask, **kwargs)
    assert mine[0] == pytest.approx(theirs[0], rel=1e-6)
    np.testing.assert_allclose(mine[1], theirs[1], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_global_loss_has_the_gradient_trls_ranks_average(world_size):
    """Rows split over `world_size` ranks, each calling TRL's compute_loss with the global token count: their mean
    loss and their mean gradient (DDP's average) are jaxcore's loss over the whole batch and its gradient."""
    logp, sampler, advantages, mask = batch(4, B=6)
    ranks = np.array_split(np.arange(6), world_size)
    tokens = float(mask.sum())
    parts = [trl_loss(logp[r], sampler[r], advantages[r], mask[r], epsilon=0.2, epsilon_high=None,
                      world_size=world_size, num_tokens=tokens) for r in ranks]
    mine = ours(logp, sampler, advantages, mask, world_size=world_size)
    assert mine[0] == pytest.approx(sum(p[0] for p in parts) / world_size, rel=1e-6)
    np.testing.assert_allclose(mine[1], np.concatenate([p[1] for p in parts]) / world_size, rtol=1e-6, atol=1e-9)


def test_fewer_tokens_than_ranks_is_clamped_as_trls():
    logp, sampler, advantages, mask = batch(5, B=2, T=3, empty_row=False)
    mask[:] = 0.0
    mask[1, 1] = 1.0                                           # one token over four ranks: tokens per rank 0.25 -> 1
    logp = np.where(mask > 0, sampler + 0.1, logp)
    theirs = trl_loss(logp, sampler, advantages, mask, epsilon=0.2, epsilon_high=None, world_size=4)
    mine = ours(logp, sampler, advantages, mask, world_size=4)
    assert mine[0] == pytest.approx(theirs[0] / 4, rel=1e-6)   # one rank holds the token; DDP averages over 4


def test_entropy_metric_equals_trls():
    logp, sampler, advantages, mask = batch(6)
    entropy = np.random.default_rng(1).uniform(0, 3, mask.shape).astype(np.float32)
    theirs = trl_loss(logp, sampler, advantages, mask, epsilon=0.2, epsilon_high=None, entropy_BT=entropy)
    mine = ours(logp, sampler, advantages, mask, entropy_BT=jnp.asarray(entropy))
    assert mine[2]["entropy"] == pytest.approx(theirs[2]["entropy"], rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_policy_log_probs_equal_trls(seed):
    """A bf16 training forward's log-probs against float32 sampler log-probs (what vLLM returns): both upcast
    before the ratio, so the loss and metrics agree to float32 rounding; the gradient reaches bf16 log-probs in
    bf16 in both."""
    logp, sampler, advantages, mask = batch(seed)
    logp_bf16 = np.asarray(jnp.asarray(logp, jnp.bfloat16).astype(jnp.float32))
    theirs = trl_loss(logp_bf16, sampler, advantages, mask, epsilon=0.2, epsilon_high=0.28, dtype=torch.bfloat16)
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: async_grpo_loss(lp, jnp.asarray(sampler), jnp.asarray(advantages), jnp.asarray(mask),
                                   epsilon=0.2, epsilon_high=0.28), has_aux=True)(jnp.asarray(logp, jnp.bfloat16))
    assert grad.dtype == jnp.bfloat16
    assert float(loss) == pytest.approx(theirs[0], rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(np.asarray(grad, np.float32), theirs[1], rtol=1e-2, atol=1e-6)
    for key in TRL_METRICS:
        assert float(metrics[key]) == pytest.approx(theirs[2][key], rel=1e-6, abs=1e-7), key


def test_lag_zero_is_the_synchronous_loss_bit_for_bit():
    """Sampled with the weights it trains (lag 0: no sampler log-probs, the ratio is 1): the async loss,
    its gradient and its clip metrics are the synchronous GRPO loss's of one micro-batch (dapo, beta 0,
    num_iterations 1: no stored old log-probs, TRL's ratio of 1), bit for bit."""
    from jaxcore.grpo.config import GRPOLossConfig
    from jaxcore.grpo.loss import grpo_loss

    logp, _, advantages, mask = batch(7, empty_row=False)
    cfg = GRPOLossConfig(loss_type="dapo", epsilon=0.2, epsilon_high=0.28)
    rest = (jnp.asarray(advantages), jnp.asarray(mask))
    (a, ma), ga = jax.value_and_grad(
        lambda lp: async_grpo_loss(lp, None, *rest, epsilon=0.2, epsilon_high=0.28),
        has_aux=True)(jnp.asarray(logp))
    (s, ms), gs = jax.value_and_grad(lambda lp: grpo_loss(lp, None, None, *rest, cfg), has_aux=True)(jnp.asarray(logp))
    assert float(a) == float(s) and float(a) != 0.0
    np.testing.assert_array_equal(np.asarray(ga), np.asarray(gs))
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert float(ma[key]) == float(ms[key])


def test_staleness_metrics_are_trls():
    m = staleness_metrics(5, jnp.asarray([5, 4, 4, 2]))
    assert float(m["sample/staleness_mean"]) == pytest.approx(1.25) and float(m["sample/staleness_max"]) == 3.0
