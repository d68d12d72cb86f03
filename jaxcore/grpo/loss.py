"""The GRPO policy loss with TRL 1.16's `GRPOTrainer._compute_loss` formulas, as pure `jnp`.

Shapes: B completions, T completion-token positions. Works on sharded global arrays inside `jax.jit`.
The loss types (per-token term, reduction, clipping) are `jaxcore.grpo.loss_types.LOSS_KINDS`. Options: token-
or sequence-level (GSPO) importance ratios, two-sided clipping `delta`, the bias-corrected KL (`kl * ratio`),
`top_entropy_quantile`, the entropy bonus `entropy_coef`, and the off-policy sequence mask
(`off_policy_mask_threshold`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxcore.grpo.config import loss_settings
from jaxcore.grpo.loss_types import clip_range, loss_kind

Array = jax.Array

def entropy_bonus_enabled(cfg: Any) -> bool:
    """Whether the loss has the entropy bonus term: a non-zero entropy_coef, or the adaptive controller (whose
    coefficient may sink to 0 and rise again: TRL's `_entropy_bonus_enabled`)."""
    cfg = loss_settings(cfg)
    return cfg.entropy_coef != 0.0 or bool(cfg.use_adaptive_entropy)


def adapted_entropy_coef(coef: Array, window_entropy: Array, cfg: Any) -> Array:
    """TRL's controller after an optimiser step whose token-weighted entropy was `window_entropy`: the coefficient
    up by entropy_coef_delta (at most entropy_coef_max) at or below entropy_target, down (at least
    entropy_coef_min) above it."""
    up = jnp.minimum(coef + cfg.entropy_coef_delta, cfg.entropy_coef_max)
    down = jnp.maximum(coef - cfg.entropy_coef_delta, cfg.entropy_coef_min)
    return jnp.where(window_entropy <= cfg.entropy_target, up, down)


# ----------------------------------------------------------------------------- pieces


def masked_mean(x_BT: Array, mask_BT: Array) -> Array:
    """sum(x * mask) / max(sum(mask), 1) (TRL's `global_masked_mean`); a [B, 1] x is averaged over rows."""
    if x_BT.shape[-1] == 1 and mask_BT.shape[-1] != 1:
        return x_BT.mean()
    return jnp.where(mask_BT, x_BT, 0.0).sum() / jnp.maximum(mask_BT.sum(), 1.0)


def k3_kl(logp_BT: Array, ref_logp_BT: Array) -> Array:
    """Per-token k3 estimator of KL(policy || ref): exp(ref - logp) - (ref - logp) - 1."""
    diff_BT = ref_logp_BT - logp_BT
    return jnp.exp(diff_BT) - diff_BT - 1.0


def high_entropy_mask(entropy_BT: Array, mask_BT: Array, quantile: float) -> Array:
    """Tokens whose entropy is >= the `1 - quantile` quantile (linear interpolation, as `torch.quantile`)
    of the active tokens' entropies; all False when no token is active."""
    entropy_BT = jax.lax.stop_gradient(entropy_BT)
    threshold = jnp.nanquantile(jnp.where(mask_BT, entropy_BT, jnp.nan), 1.0 - quantile)
    return (jnp.where(mask_BT, entropy_BT, 0.0) >= threshold) & mask_BT & (mask_BT.sum() > 0)


def off_policy_mask(advantages_B1: Array, logp_BT: Array, old_logp_BT: Array, mask_BT: Array, threshold: float
                    ) -> Array:
    """[B, 1]: keep a row if A >= 0 or its mean (old - new) log-prob <= threshold (DeepSeek-V3.2's mask)."""
    kl_BT = jnp.where(mask_BT, old_logp_BT - jax.lax.stop_gradient(logp_BT), 0.0)
    seq_kl_B1 = kl_BT.sum(-1, keepdims=True) / jnp.maximum(mask_BT.sum(-1, keepdims=True), 1.0)
    return ((advantages_B1 >= 0) | (seq_kl_B1 <= threshold)).astype(jnp.float32)


def aggregate(per_token_BT: Array, mask_BT: Array, loss_type: str, max_completion_length: int | None,
              num_items_in_batch: Array | float | None = None) -> Array:
    """Reduce a per-token loss to a scalar the way TRL's `loss_type` does (`LOSS_KINDS[loss_type].reduce`, before
    accumulation scaling); `num_items_in_batch` is the whole optimiser step's active tokens (default: this
    batch's), which the step-normalised types divide by."""
    kind = loss_kind(loss_type)
    total_B = jnp.where(mask_BT, per_token_BT, 0.0).sum(-1)
    count_B = mask_BT.astype(jnp.float32).sum(-1)
    step_tokens = count_B.sum() if num_items_in_batch is None else jnp.asarray(num_items_in_batch, jnp.float32)
    return kind.reduce(total_B, count_B, max_completion_length, step_tokens)


# ----------------------------------------------------------------------------- the loss


def grpo_loss(logp_BT: Array, old_logp_BT: Array | None, ref_logp_BT: Array | None, advantages_B: Array,
              mask_BT: Array, cfg: Any, num_items_in_batch: Array | float | None = None, *,
              entropy_BT: Array | None = None, accumulation_steps: int = 1, max_completion_length: int | None = None,
              entropy_coef: Array | float | None = None) -> tuple[Array, dict[str, Array]]:
    """TRL's `_compute_loss` after the forward: policy term, entropy mask, KL, aggregation, entropy bonus.

    ratio = exp(logp - old_logp) per token, or exp(masked mean of it) per row at sequence level
    (old_logp None: stop_gradient(logp), TRL's mu == 1 shortcut). With `use_bias_correction_kl` the
    k3 KL is multiplied by that (differentiable) ratio, and the logged `kl` is the corrected one.
    `accumulation_steps` n: this batch is one of n micro-batches of an optimiser step; like TRL the
    loss is divided by n except for the dapo/cispo/vespo types (`num_items_in_batch` spans the step).
    `entropy_BT` (differentiable) is needed for `top_entropy_quantile` < 1 and `entropy_coef` != 0.
    `max_completion_length` (TRL's; a job's rollout.completion_tokens) is dr_grpo's constant normaliser and
    needed by it only. `entropy_coef` (default: the config's) is the bonus's coefficient this step, a traced value
    under `use_adaptive_entropy` (`entropy_bonus_enabled`: the bonus term is then always in the loss); the bonus's
    token entropy sum and count are in the metrics (`entropy_sum`, `entropy_tokens`) for the controller.
    Masked positions are zeroed before any exp, so junk log-probs there cannot produce inf/NaN. `cfg`: a
    `GRPOLossConfig`, or any object with its names (TRL's defaults for those it lacks: `config.loss_settings`).
    """
    cfg = loss_settings(cfg)
    mask_BT = jnp.asarray(mask_BT).astype(bool)
    logp_BT = logp_BT.astype(jnp.float32)
    old_logp_BT = jax.lax.stop_gradient(logp_BT) if old_logp_BT is None else old_logp_BT.astype(jnp.float32)
    advantages_B1 = jnp.asarray(advantages_B, jnp.float32)[:, None]
    quantile = cfg.top_entropy_quantile
    bonus = entropy_bonus_enabled(cfg)
    entropy_coef = cfg.entropy_coef if entropy_coef is None else entropy_coef
    if entropy_BT is None and (quantile < 1.0 or bonus):
        raise ValueError("top_entropy_quantile < 1 and entropy_coef != 0 need entropy_BT")
    entropy_mask_BT = high_entropy_mask(entropy_BT, mask_BT, quantile) if quantile < 1.0 else None

    log_ratio_BT = jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0)
    if cfg.importance_sampling_level == "sequence":
        log_weight = log_ratio_BT.sum(-1, keepdims=True) / jnp.maximum(mask_BT.sum(-1, keepdims=True), 1.0)
    else:
        log_weight = log_ratio_BT
    coef_1 = jnp.exp(log_weight)                                     # [B, T] or [B, 1]

    metrics: dict[str, Array] = {}
    if cfg.beta != 0.0:
        if ref_logp_BT is None:
            raise ValueError("beta != 0 needs ref_logp_BT (log-probs of the reference model)")
        kl_BT = k3_kl(jnp.where(mask_BT, logp_BT, 0.0), jnp.where(mask_BT, ref_logp_BT.astype(jnp.float32), 0.0))
        if cfg.use_bias_correction_kl:
            kl_BT = kl_BT * coef_1
        metrics["kl"] = masked_mean(jax.lax.stop_gradient(kl_BT), mask_BT)

    safe_logp_BT = jnp.where(mask_BT, logp_BT, 0.0)
    kind = loss_kind(cfg.loss_type)
    per_token, ratio, extra = kind.term(safe_logp_BT, coef_1, log_ratio_BT, advantages_B1, mask_BT, cfg)
    per_token_BT = jnp.broadcast_to(per_token, mask_BT.shape)
    threshold = cfg.off_policy_mask_threshold
    if threshold is not None:
        per_token_BT = per_token_BT * off_policy_mask(advantages_B1, logp_BT, old_logp_BT, mask_BT, threshold)
    if entropy_mask_BT is not None:
        per_token_BT = per_token_BT * entropy_mask_BT
    if cfg.beta != 0.0:
        per_token_BT = per_token_BT + cfg.beta * kl_BT
    loss = aggregate(per_token_BT, mask_BT, cfg.loss_type, max_completion_length, num_items_in_batch)
    if bonus:
        metrics["policy_loss"] = jax.lax.stop_gradient(loss)
    if not kind.over_the_step:
        loss = loss / accumulation_steps
    if bonus:
        bonus_mask_BT = mask_BT if entropy_mask_BT is None else entropy_mask_BT
        loss = loss - entropy_coef * masked_mean(entropy_BT, bonus_mask_BT) / accumulation_steps
        if cfg.use_adaptive_entropy:
            metrics["entropy_sum"] = jnp.where(bonus_mask_BT, jax.lax.stop_gradient(entropy_BT), 0.0).sum()
            metrics["entropy_tokens"] = bonus_mask_BT.sum().astype(jnp.float32)

    metrics.update({k: masked_mean(v, mask_BT) for k, v in extra.items()})
    if kind.clipped:
        metrics.update(clip_metrics(jax.lax.stop_gradient(ratio), advantages_B1, mask_BT, cfg))
    return loss, metrics


def clip_metrics(ratio: Array, advantages_B1: Array, mask_BT: Array, cfg: Any) -> dict[str, Array]:
    """TRL's `clip_ratio/{low,high,region}_mean` (share of tokens, rows at sequence level, outside the clip) and
    `clip_ratio/low_min` / `high_max` (the smallest / largest such share of one row; rows without tokens left
    out)."""
    low, high = clip_range(cfg)
    is_low = ((ratio < low) & (advantages_B1 < 0)).astype(jnp.float32)
    is_high = ((ratio > high) & (advantages_B1 > 0)).astype(jnp.float32)
    return {"clip_ratio/low_mean": masked_mean(is_low, mask_BT),
            "clip_ratio/high_mean": masked_mean(is_high, mask_BT),
            "clip_ratio/region_mean": masked_mean(jnp.maximum(is_low, is_high), mask_BT),
            "clip_ratio/low_min": jnp.nanmin(row_means(is_low, mask_BT)),
            "clip_ratio/high_max": jnp.nanmax(row_means(is_high, mask_BT))}


def row_means(x_BT: Array, mask_BT: Array) -> Array:
    """Each row's masked mean [B] (NaN for a row without tokens; a [B, 1] x is its own row value): TRL's
    `masked_seq_mean`."""
    if x_BT.shape[-1] == 1 and mask_BT.shape[-1] != 1:
        return x_BT[:, 0]
    return jnp.where(mask_BT, x_BT, 0.0).sum(-1) / mask_BT.sum(-1)
