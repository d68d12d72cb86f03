"""GRPO math with TRL's GRPOTrainer formulas: reward combination and advantages (the loss: `jaxcore.grpo.loss`).

Shapes: B completions (G per prompt, groups contiguous), T completion-token positions.
Everything here is pure `jnp` and works on sharded global arrays inside `jax.jit`.
The train step that uses it lives in `jaxcore.grpo.step`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxcore.grpo.config import SCALES
from jaxcore.runtime.reward_scale import in_units, power_of_two_scale

Array = jax.Array

STD_EPS = 1e-4                      # TRL: advantages / (std + 1e-4)


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
    """Mean ignoring NaNs, of x divided by a power of two (`power_of_two_scale`: exact, 1 for rewards below 2**50)
    and multiplied back, so that rewards near float32's limit do not overflow the sum."""
    scale = power_of_two_scale(x, axis)
    valid = ~jnp.isnan(x)
    return scale * (jnp.where(valid, x / scale, 0.0).sum(axis, keepdims=True) / valid.sum(axis, keepdims=True))


class Spread(NamedTuple):
    """Rewards' spread along an axis, in units of a power of two per slice (`in_units`): TRL's numbers below
    2**50, finite above, and exactly 0 for a constant slice of any size."""

    deviation: Array    # x minus its NaN-aware mean, in `unit`s (NaN where x is)
    std: Array          # sample std (ddof 1) in `unit`s; NaN where fewer than two values (TRL's `nanstd`)
    unit: Array         # 2**k per slice (the axis kept, of length 1)


def spread(x: Array, axis: int | None) -> Spread:
    """x's deviations from its NaN-aware mean and its sample std along `axis` (None: all of x)."""
    y, unit = in_units(x, axis)
    valid = ~jnp.isnan(y)
    count = valid.sum(axis, keepdims=True)
    deviation = y - jnp.where(valid, y, 0.0).sum(axis, keepdims=True) / count
    counted = jnp.where(valid, deviation, 0.0)
    var = (counted * counted).sum(axis, keepdims=True) / (count - 1)
    return Spread(deviation, jnp.where(count > 1, jnp.sqrt(var), jnp.nan), unit)


def _nanstd(x: Array, axis: int | None) -> Array:
    """Sample std (ddof 1) ignoring NaNs; NaN where fewer than two values (TRL's `nanstd`), finite for rewards of
    any finite size (1e20: squares past float32's limit)."""
    s = spread(x, axis)
    return s.unit * s.std


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
    return _advantages(rewards_B, group_size, scale)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _advantages(rewards_B: Array, group_size: int, scale: str) -> Array:
    """`compute_advantages` as one program (rather than a dozen, each compiled on its first use). Each group is
    taken in its own power of two and the batch's std in the batch's (`spread`): rewards spread over float32's
    range keep a finite difference from their mean and a finite std, and one huge reward changes no other group."""
    group = spread(rewards_B.reshape(-1, group_size), 1)
    if scale == "none":
        advantages_NG = group.deviation * group.unit
    elif scale == "group":
        advantages_NG = group.deviation / (group.std + STD_EPS / group.unit)
    else:
        batch = spread(rewards_B, None)
        advantages_NG = group.deviation * (group.unit / batch.unit) / (batch.std + STD_EPS / batch.unit)
    return jnp.nan_to_num(advantages_NG.reshape(-1), nan=0.0)


def normalized_sum_advantages(values_BK: Array, weights_K: Array, group_size: int) -> tuple[Array, Array]:
    """TRL's `normalize_then_sum`: each function's rewards (columns of `values_BK`, NaN where it gave none)
    minus its group mean, over its group std + 1e-4; their weighted sum (NaN-aware; NaN where no function scored
    the row); then that minus its batch mean over its batch std + 1e-4 (NaN rows get advantage 0). Returns the
    advantages [B] and the share of rows whose denominator std is ~0 (TRL's frac_reward_zero_std here)."""
    values_BK = jnp.asarray(values_BK, jnp.float32)
    if values_BK.ndim != 2 or values_BK.shape[0] % group_size:
        raise ValueError(f"rewards of shape {values_BK.shape} do not split into groups of {group_size}")
    return _normalized_sum(values_BK, jnp.asarray(weights_K, jnp.float32), group_size)


@functools.partial(jax.jit, static_argnums=(2,))
def _normalized_sum(values_BK: Array, weights_K: Array, group_size: int) -> tuple[Array, Array]:
    group = spread(values_BK.reshape(-1, group_size, values_BK.shape[1]), 1)    # per group and function
    std_N1K = group.std if group_size > 1 else jnp.zeros_like(group.std)
    normalized_BK = (group.deviation / (std_N1K + STD_EPS / group.unit)).reshape(values_BK.shape)
    terms_BK = normalized_BK * weights_K
    summed_B = jnp.where(jnp.isnan(terms_BK), 0.0, terms_BK).sum(1)
    summed_B = jnp.where(jnp.isnan(values_BK).all(1), jnp.nan, summed_B)
    batch = spread(summed_B, None)
    std = batch.std if summed_B.size > 1 else jnp.zeros((1,))
    advantages_B = batch.deviation / (std + STD_EPS / batch.unit)
    return jnp.nan_to_num(advantages_B, nan=0.0), jnp.isclose(batch.unit * std, 0.0).astype(jnp.float32).mean()


def reward_metrics(per_function: Mapping[str, Any], rewards_B: Array, group_size: int, scale: str = "group"
                   ) -> dict[str, float]:
    """TRL's reward logs: `reward`, `reward_std`, `rewards/<name>/mean|std` (NaN-aware), and
    `frac_reward_zero_std` (share of rows whose advantage denominator std is ~0)."""
    names = list(per_function)
    values = {name: jnp.asarray(per_function[name], jnp.float32) for name in names}
    stats = jax.device_get(_reward_stats(values, jnp.asarray(rewards_B, jnp.float32), group_size, scale))
    out = {}
    for name in names:
        out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = (float(x) for x in stats[name])
    out["reward"], out["reward_std"], out["frac_reward_zero_std"] = (float(x) for x in stats[""])
    return out


@functools.partial(jax.jit, static_argnums=(2, 3))
def _reward_stats(values: dict[str, Array], rewards_B: Array, group_size: int, scale: str) -> dict[str, Array]:
    """`reward_metrics`' numbers as one program: per function (mean, std), and under "" the combined reward's
    (mean, std, share of zero-std rows)."""
    out = {name: jnp.stack([_nanmean(v, None)[0], _nanstd(v, None)[0]]) for name, v in values.items()}
    out[""] = jnp.stack([_nanmean(rewards_B, None)[0], _nanstd(rewards_B, None)[0],
                         jnp.isclose(reward_std(rewards_B, group_size, scale), 0.0).mean()])
    return out
