"""The loss of TRL 1.16's asynchronous GRPO (`trl.experimental.async_grpo.AsyncGRPOTrainer.compute_loss`), as pure
`jnp`: the importance ratio is taken against the log-probs the rollout sampled with (no separate old-log-prob
forward), clipped PPO-style with `epsilon` / `epsilon_high`, summed over the tokens and divided by the micro-batch's
global token count and the accumulation steps. No KL term, no entropy bonus: TRL's async loss has neither.

Shapes: B completions, T completion-token positions (a packed batch's rows are completions here; TRL's flat
`token_index` selection is the mask). The per-token term and the clip-ratio metrics are the synchronous loss's
(`jaxcore.grpo.loss_types.clipped_term`, `jaxcore.grpo.loss.clip_metrics`): the same math.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcore.grpo.loss import clip_metrics, masked_mean
from jaxcore.grpo.loss_types import clipped_term

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class AsyncClip:
    """The clip settings TRL's async loss reads (`epsilon`, `epsilon_high`; None: epsilon). `delta` is always None:
    the async trainer has no two-sided clipping."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: None = None


def async_grpo_loss(logp_BT: Array, sampler_logp_BT: Array | None, advantages_B: Array, mask_BT: Array, *,
                    epsilon: float = 0.2, epsilon_high: float | None = None, num_tokens: Array | float | None = None,
                    world_size: int = 1, accumulation_steps: int = 1, entropy_BT: Array | None = None
                    ) -> tuple[Array, dict[str, Array]]:
    """TRL's `AsyncGRPOTrainer.compute_loss` after the forward, over the global batch.

    ratio = exp(logp - sampler_logp) per token; per-token loss -min(ratio * A, clip(ratio, 1 - epsilon,
    1 + epsilon_high) * A); loss = token sum / max(num_tokens / world_size, 1) / world_size / accumulation_steps,
    which is the gradient TRL's ranks average (each divides its own sum by max(global tokens / world size, 1)).
    `sampler_logp_BT` None: the batch was sampled from the very weights being trained (`Schedule.on_policy`), so
    the ratio is exactly 1 (stop_gradient(logp), the synchronous loss's mu = 1 shortcut) rather than the sampler's
    rounding-level distance from the training forward: with lag 0 a run is then the synchronous one.
    `num_tokens` is TRL's `global_n_tokens`: the micro-batch's active tokens over every rank (default: this
    batch's). Metrics under TRL's names: `ratio`, `kl` (the mean of (ratio - 1) - log ratio, the sampler-to-policy
    k3 estimate), `entropy` (with `entropy_BT`), `clip_ratio/{low,high,region}_mean`, `clip_ratio/low_min` and
    `high_max` (over completions). Masked positions are zeroed before any exp. A batch without active tokens has
    loss 0 and metrics 0 (TRL's are NaN there).
    """
    clip = AsyncClip(epsilon, epsilon_high)
    mask_BT = jnp.asarray(mask_BT).astype(bool)
    advantages_B1 = jnp.asarray(advantages_B, jnp.float32)[:, None]
    logp32_BT = logp_BT.astype(jnp.float32)
    sampler32_BT = jax.lax.stop_gradient(logp32_BT) if sampler_logp_BT is None else sampler_logp_BT.astype(jnp.float32)
    log_ratio_BT = jnp.where(mask_BT, logp32_BT - sampler32_BT, 0.0)
    ratio_BT = jnp.exp(log_ratio_BT)
    per_token_BT, _, _ = clipped_term(logp_BT, ratio_BT, log_ratio_BT, advantages_B1, mask_BT, clip)
    total = jnp.where(mask_BT, per_token_BT, 0.0).sum(-1).sum()         # rows first, as the dapo reduction sums
    tokens = mask_BT.sum().astype(jnp.float32) if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
    loss = total / (jnp.maximum(tokens / world_size, 1.0) * world_size) / accumulation_steps

    ratio_BT = jax.lax.stop_gradient(ratio_BT)
    log_ratio_BT = jax.lax.stop_gradient(log_ratio_BT)
    metrics = {"ratio": masked_mean(ratio_BT, mask_BT),
               "kl": masked_mean((ratio_BT - 1.0) - log_ratio_BT, mask_BT)}
    if entropy_BT is not None:
        metrics["entropy"] = masked_mean(jax.lax.stop_gradient(entropy_BT).astype(jnp.float32), mask_BT)
    metrics.update(clip_metrics(ratio_BT, advantages_B1, mask_BT, clip))
    return loss, metrics


def staleness_metrics(model_version: Array | int, sample_versions_B: Array) -> dict[str, Array]:
    """TRL's `sample/staleness_mean` and `sample/staleness_max` of the samples trained on: the trainer's weight
    version minus the version each sample was generated with (versions count weight syncs)."""
    staleness_B = jnp.asarray(model_version, jnp.float32) - jnp.asarray(sample_versions_B, jnp.float32)
    return {"sample/staleness_mean": staleness_B.mean(), "sample/staleness_max": staleness_B.max()}
