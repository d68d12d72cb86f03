"""GRPO math with TRL's GRPOTrainer formulas: reward combination, advantages, and the clipped loss.

Shapes: B completions (G per prompt, groups contiguous), T completion-token positions.
Everything here is pure `jnp` and works on sharded global arrays inside `jax.jit`.
The train step that uses it lives in `jaxcore.grpo_step`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp

Array = jax.Array

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")
STD_EPS = 1e-4                      # TRL: advantages / (std + 1e-4)


class LossConfigLike(Protocol):
    """Anything with these attributes configures `grpo_loss`."""

    loss_type: str
    epsilon: float
    epsilon_high: float | None
    beta: float
    max_completion_length: int


@dataclasses.dataclass(frozen=True)
class GRPOLossConfig:
    """The loss settings (names and defaults as in TRL's GRPOConfig)."""

    loss_type: str = "dapo"                 # "grpo" | "bnpo" | "dr_grpo" | "dapo"
    epsilon: float = 0.2                    # lower clip: ratio >= 1 - epsilon
    epsilon_high: float | None = None       # upper clip: ratio <= 1 + epsilon_high (None: epsilon)
    beta: float = 0.0                       # k3-KL coefficient; 0 means no reference model
    max_completion_length: int = 512        # dr_grpo's constant normaliser

    def __post_init__(self) -> None:
        validate_loss_config(self)


def validate_loss_config(cfg: LossConfigLike) -> None:
    """Raise ValueError for an unknown loss type or impossible clip range."""
    if cfg.loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {cfg.loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    if cfg.epsilon < 0 or (cfg.epsilon_high is not None and cfg.epsilon_high < 0):
        raise ValueError("epsilon and epsilon_high must be >= 0")
    if cfg.loss_type == "dr_grpo" and cfg.max_completion_length <= 0:
        raise ValueError("dr_grpo needs max_completion_length > 0")


def clip_range(cfg: LossConfigLike) -> tuple[float, float]:
    """(1 - epsilon, 1 + epsilon_high), with epsilon_high defaulting to epsilon as in TRL."""
    high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    return 1.0 - cfg.epsilon, 1.0 + high


# ----------------------------------------------------------------------------- rewards and advantages


def combine_rewards(per_function: Mapping[str, Any], weights: Mapping[str, float] | Sequence[float] | None = None
                    ) -> Array:
    """Weighted NaN-aware sum over reward functions: [B] (TRL's `nansum(rewards_per_func * w)`).

    NaN (a function returned None) counts as "not scored" for that function. A completion that no
    function scored stays NaN, as in current TRL (PR #5902): `compute_advantages` leaves it out of its
    group's mean/std and gives it advantage 0 (nansum's 0 would bias the baseline).
    """
    names = list(per_function)
    if not names:
        raise ValueError("combine_rewards needs at least one reward function")
    if weights is None:
        w_F = jnp.ones(len(names), jnp.float32)
    elif isinstance(weights, Mapping):
        w_F = jnp.asarray([weights[n] for n in names], jnp.float32)
    else:
        if len(weights) != len(names):
            raise ValueError(f"{len(weights)} weights for {len(names)} reward functions")
        w_F = jnp.asarray(weights, jnp.float32)
    rewards_BF = jnp.stack([jnp.asarray(per_function[n], jnp.float32) for n in names], axis=1)
    scored_BF = ~jnp.isnan(rewards_BF)
    total_B = jnp.where(scored_BF, rewards_BF * w_F, 0.0).sum(1)
    return jnp.where(scored_BF.any(1), total_B, jnp.nan)


def _nanmean(x: Array, axis: int | None) -> Array:
    valid = ~jnp.isnan(x)
    return jnp.where(valid, x, 0.0).sum(axis, keepdims=True) / valid.sum(axis, keepdims=True)


def _nanstd(x: Array, axis: int | None) -> Array:
    """Sample std (ddof=1) ignoring NaNs; NaN where fewer than two values (TRL's `nanstd`)."""
    valid = ~jnp.isnan(x)
    count = valid.sum(axis, keepdims=True)
    dev = jnp.where(valid, x - _nanmean(x, axis), 0.0)
    var = (dev * dev).sum(axis, keepdims=True) / (count - 1)
    return jnp.where(count > 1, jnp.sqrt(var), jnp.nan)


def reward_std(rewards_B: Array, group_size: int, scale: str) -> Array:
    """The std each advantage is divided by: [B] (per group for "group"/"none", whole batch for "batch")."""
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    if scale == "batch":
        std = _nanstd(rewards_B, None) if rewards_B.size > 1 else jnp.zeros((1,))
        return jnp.broadcast_to(std, rewards_B.shape)
    if group_size == 1:
        return jnp.zeros_like(rewards_B)
    return jnp.repeat(_nanstd(rewards_B.reshape(-1, group_size), 1)[:, 0], group_size)


def compute_advantages(rewards_B: Array, group_size: int, scale: str = "group") -> Array:
    """A = r - mean(group), divided by (std + 1e-4) unless scale == "none"; NaN rewards get A = 0.

    `scale`: "group" (per-group sample std), "batch" (sample std over all B rewards), "none".
    Rows are grouped contiguously: group g is rows [g * group_size, (g + 1) * group_size).
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {', '.join(SCALES)}")
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    if rewards_B.ndim != 1 or rewards_B.shape[0] % group_size:
        raise ValueError(f"rewards of shape {rewards_B.shape} do not split into groups of {group_size}")
    rewards_NG = rewards_B.reshape(-1, group_size)
    advantages_B = (rewards_NG - _nanmean(rewards_NG, 1)).reshape(-1)
    if scale != "none":
        advantages_B = advantages_B / (reward_std(rewards_B, group_size, scale) + STD_EPS)
    return jnp.nan_to_num(advantages_B, nan=0.0)


def reward_metrics(per_function: Mapping[str, Any], rewards_B: Array, group_size: int, scale: str = "group"
                   ) -> dict[str, float]:
    """TRL's reward logs: `reward`, `reward_std`, `rewards/<name>/mean|std` (NaN-aware), and
    `frac_reward_zero_std` (share of rows whose advantage denominator std is ~0)."""
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    out = {}
    for name, values in per_function.items():
        values_B = jnp.asarray(values, jnp.float32)
        out[f"rewards/{name}/mean"] = float(_nanmean(values_B, None)[0])
        out[f"rewards/{name}/std"] = float(_nanstd(values_B, None)[0])
    out["reward"] = float(_nanmean(rewards_B, None)[0])
    out["reward_std"] = float(_nanstd(rewards_B, None)[0])
    out["frac_reward_zero_std"] = float(jnp.isclose(reward_std(rewards_B, group_size, scale), 0.0).mean())
    return out


# ----------------------------------------------------------------------------- the loss


def masked_mean(x_BT: Array, mask_BT: Array) -> Array:
    """sum(x * mask) / max(sum(mask), 1) (TRL's `global_masked_mean`)."""
    return jnp.where(mask_BT, x_BT, 0.0).sum() / jnp.maximum(mask_BT.sum(), 1.0)


def k3_kl(logp_BT: Array, ref_logp_BT: Array) -> Array:
    """Per-token k3 estimator of KL(policy || ref): exp(ref - logp) - (ref - logp) - 1."""
    diff_BT = ref_logp_BT - logp_BT
    return jnp.exp(diff_BT) - diff_BT - 1.0


def aggregate(per_token_BT: Array, mask_BT: Array, loss_type: str, max_completion_length: int,
              num_items_in_batch: Array | float | None = None) -> Array:
    """Reduce a per-token loss to a scalar the way TRL's `loss_type` does.

    grpo: mean over sequences of the per-sequence masked mean; bnpo: sum / active tokens;
    dr_grpo: sum / (B * max_completion_length); dapo: sum / `num_items_in_batch`, the active-token
    count of the whole accumulated batch (defaults to this batch's count, i.e. bnpo).
    """
    total_B = jnp.where(mask_BT, per_token_BT, 0.0).sum(-1)
    count_B = mask_BT.astype(jnp.float32).sum(-1)
    if loss_type == "grpo":
        return (total_B / jnp.maximum(count_B, 1.0)).mean()
    if loss_type == "bnpo":
        return total_B.sum() / jnp.maximum(count_B.sum(), 1.0)
    if loss_type == "dr_grpo":
        return total_B.sum() / (per_token_BT.shape[0] * max_completion_length)
    if loss_type == "dapo":
        n = count_B.sum() if num_items_in_batch is None else jnp.asarray(num_items_in_batch, jnp.float32)
        return total_B.sum() / jnp.maximum(n, 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def grpo_loss(logp_BT: Array, old_logp_BT: Array | None, ref_logp_BT: Array | None, advantages_B: Array,
              mask_BT: Array, cfg: LossConfigLike, num_items_in_batch: Array | float | None = None
              ) -> tuple[Array, dict[str, Array]]:
    """The clipped GRPO surrogate plus beta * k3-KL, aggregated per `cfg.loss_type`.

    ratio = exp(logp - old_logp) (old_logp None: stop_gradient(logp), TRL's mu == 1 shortcut);
    loss_tok = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A) + beta * kl_tok.
    Masked positions are zeroed before any exp, so junk log-probs there cannot produce inf/NaN.
    Metrics (TRL names, masked means over this batch): `kl` (when beta != 0),
    `clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean`.
    """
    mask_BT = jnp.asarray(mask_BT).astype(bool)
    logp_BT = logp_BT.astype(jnp.float32)
    old_logp_BT = jax.lax.stop_gradient(logp_BT) if old_logp_BT is None else old_logp_BT.astype(jnp.float32)
    low, high = clip_range(cfg)
    advantages_B1 = jnp.asarray(advantages_B, jnp.float32)[:, None]

    ratio_BT = jnp.exp(jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0))
    clipped_BT = jnp.clip(ratio_BT, low, high)
    per_token_BT = -jnp.minimum(ratio_BT * advantages_B1, clipped_BT * advantages_B1)
    metrics: dict[str, Array] = {}
    if cfg.beta != 0.0:
        if ref_logp_BT is None:
            raise ValueError("beta != 0 needs ref_logp_BT (log-probs of the reference model)")
        kl_BT = k3_kl(jnp.where(mask_BT, logp_BT, 0.0), jnp.where(mask_BT, ref_logp_BT.astype(jnp.float32), 0.0))
        per_token_BT = per_token_BT + cfg.beta * kl_BT
        metrics["kl"] = masked_mean(jax.lax.stop_gradient(kl_BT), mask_BT)
    loss = aggregate(per_token_BT, mask_BT, cfg.loss_type, cfg.max_completion_length, num_items_in_batch)

    ratio_BT = jax.lax.stop_gradient(ratio_BT)
    is_low_BT = (ratio_BT < low) & (advantages_B1 < 0)
    is_high_BT = (ratio_BT > high) & (advantages_B1 > 0)
    metrics["clip_ratio/low_mean"] = masked_mean(is_low_BT.astype(jnp.float32), mask_BT)
    metrics["clip_ratio/high_mean"] = masked_mean(is_high_BT.astype(jnp.float32), mask_BT)
    metrics["clip_ratio/region_mean"] = masked_mean((is_low_BT | is_high_BT).astype(jnp.float32), mask_BT)
    return loss, metrics
