"""GRPO's loss types by name (TRL 1.16's `loss_type`), one registry entry each: the per-token policy term, how the
per-token loss reduces to a scalar, and whether the type clips PPO-style (and so logs the clip ratios). The
config's `LossType`, the loss (`jaxcore.grpo.loss`) and docs/grpo.md's table all read `LOSS_KINDS`; a new type is one
entry here. A term reads its settings as attributes of the config the loss hands it, which has every loss setting
(`jaxcore.grpo.config.loss_settings`): this module sits below the config, which derives `LossType` from it.

Shapes: B completions, T completion-token positions; a term may be per row ([B, 1]).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
Term = Callable[[Array, Array, Array, Array, Array, Any], "tuple[Array, Array, dict[str, Array]]"]


def upper_epsilon(cfg: Any) -> float:
    return cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high


def clip_range(cfg: Any) -> tuple[float, float]:
    """(1 - epsilon, 1 + epsilon_high), with epsilon_high defaulting to epsilon as in TRL."""
    return 1.0 - cfg.epsilon, 1.0 + upper_epsilon(cfg)


# ----------------------------------------------------------------------------- per-token terms
# each: (logp_BT, ratio, log_ratio_BT, advantages_B1, mask_BT, cfg) -> (loss, the ratio clip metrics see, metrics)


def clipped_term(logp_BT: Array, coef_1: Array, log_ratio_BT: Array, advantages_B1: Array, mask_BT: Array,
                 cfg: Any) -> tuple[Array, Array, dict[str, Array]]:
    """PPO's -min(ratio * A, clip(ratio) * A), the ratio capped at `delta` when set (two-sided clipping)."""
    low, up = clip_range(cfg)
    coef_2 = jnp.clip(coef_1, low, up)
    if cfg.delta is not None:
        coef_1 = jnp.minimum(coef_1, cfg.delta)
    return -jnp.minimum(coef_1 * advantages_B1, coef_2 * advantages_B1), coef_1, {}


def cispo_term(logp_BT: Array, coef_1: Array, log_ratio_BT: Array, advantages_B1: Array, mask_BT: Array,
               cfg: Any) -> tuple[Array, Array, dict[str, Array]]:
    """The detached ratio capped at 1 + epsilon_high, times A times log p."""
    high = upper_epsilon(cfg)
    capped = jax.lax.stop_gradient(jnp.minimum(coef_1, high))
    clipped = (jax.lax.stop_gradient(coef_1) > high) & (advantages_B1 > 0)
    return -capped * advantages_B1 * logp_BT, coef_1, {"cispo_clip_ratio": clipped.astype(jnp.float32)}


def sapo_term(logp_BT: Array, coef_1: Array, log_ratio_BT: Array, advantages_B1: Array, mask_BT: Array,
              cfg: Any) -> tuple[Array, Array, dict[str, Array]]:
    """The soft gate 4 / tau * sigmoid(tau * (ratio - 1)) times A (tau per the advantage's sign)."""
    temp_B1 = jnp.where(advantages_B1 > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
    return -jax.nn.sigmoid(temp_B1 * (coef_1 - 1.0)) * 4.0 / temp_B1 * advantages_B1, coef_1, {}


def vespo_weights(advantages_B1: Array, log_ratio_BT: Array, mask_BT: Array, cfg: Any) -> Array:
    """VESPO's detached Gamma weight phi(w) = exp(lambda + k log w - lambda w) of the sequence ratio w: [B, 1]."""
    lower = math.log(1e-8)
    seq_log_ratio_B1 = jnp.where(mask_BT, jnp.clip(log_ratio_BT, -20.0, 20.0), 0.0).sum(-1, keepdims=True)
    log_w_B1 = jnp.clip(seq_log_ratio_B1, lower, 20.0)
    nonneg_B1 = advantages_B1 >= 0
    k_B1 = jnp.where(nonneg_B1, cfg.vespo_k_pos, cfg.vespo_k_neg)
    lam_B1 = jnp.maximum(jnp.where(nonneg_B1, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg), 1e-4)
    phi_B1 = jnp.exp(lam_B1 + k_B1 * log_w_B1 - lam_B1 * jnp.exp(log_w_B1))
    return jax.lax.stop_gradient(jnp.nan_to_num(phi_B1, nan=0.0, posinf=0.0, neginf=0.0))


def vespo_term(logp_BT: Array, coef_1: Array, log_ratio_BT: Array, advantages_B1: Array, mask_BT: Array,
               cfg: Any) -> tuple[Array, Array, dict[str, Array]]:
    """VESPO's detached Gamma weight of the sequence ratio, times A times log p."""
    phi_B1 = vespo_weights(advantages_B1, log_ratio_BT, mask_BT, cfg)
    return -phi_B1 * advantages_B1 * logp_BT, coef_1, {"vespo/phi_seq_mean": phi_B1}


# ----------------------------------------------------------------------------- reductions
# each: (per-row sums [B], per-row active tokens [B], max_completion_length, the step's active tokens) -> scalar


def row_mean(total_B: Array, count_B: Array, max_length: int | None, step_tokens: Array) -> Array:
    """Each row's mean over its tokens, then the mean over rows."""
    return (total_B / jnp.maximum(count_B, 1.0)).mean()


def token_mean(total_B: Array, count_B: Array, max_length: int | None, step_tokens: Array) -> Array:
    """The batch's sum over its active tokens."""
    return total_B.sum() / jnp.maximum(count_B.sum(), 1.0)


def fixed_length_mean(total_B: Array, count_B: Array, max_length: int | None, step_tokens: Array) -> Array:
    """The batch's sum over rows x max_completion_length (a constant normaliser)."""
    if max_length is None or max_length <= 0:
        raise ValueError(f"dr_grpo needs max_completion_length > 0 (the rollout's completion_tokens), "
                         f"not {max_length}")
    return total_B.sum() / (total_B.shape[0] * max_length)


def row_sum_mean(total_B: Array, count_B: Array, max_length: int | None, step_tokens: Array) -> Array:
    """Each row's sum, then the mean over rows."""
    return total_B.mean()


def step_token_mean(total_B: Array, count_B: Array, max_length: int | None, step_tokens: Array) -> Array:
    """The batch's sum over the active tokens of the whole optimiser step (not divided by accumulation)."""
    return total_B.sum() / jnp.maximum(step_tokens, 1.0)


@dataclasses.dataclass(frozen=True)
class LossKind:
    """One loss type: its per-token term, its reduction, and whether it clips PPO-style (clip-ratio metrics)."""

    term: Term
    reduce: Callable[[Array, Array, int | None, Array], Array]
    clipped: bool
    summary: str                  # one line for docs/grpo.md's table

    @property
    def over_the_step(self) -> bool:
        """Normalised by the whole optimiser step's tokens: micro-batch losses are not divided by accumulation."""
        return self.reduce is step_token_mean


LOSS_KINDS: dict[str, LossKind] = {
    "grpo": LossKind(clipped_term, row_mean, True, "clipped surrogate, per-sequence mean then batch mean"),
    "bnpo": LossKind(clipped_term, token_mean, True, "clipped surrogate over the batch's active tokens"),
    "dr_grpo": LossKind(clipped_term, fixed_length_mean, True,
                        "clipped surrogate over rows x max_completion_length"),
    "dapo": LossKind(clipped_term, step_token_mean, True,
                     "clipped surrogate over the optimiser step's active tokens (default)"),
    "cispo": LossKind(cispo_term, step_token_mean, False,
                      "detached ratio capped at `epsilon_high`, x A x log p"),
    "sapo": LossKind(sapo_term, row_mean, False,
                     "sigmoid gate 4/tau sigmoid(tau (r - 1)) x A, `sapo_temperature_pos/neg`"),
    "luspo": LossKind(clipped_term, row_sum_mean, True, "clipped surrogate, per-sequence sums"),
    "vespo": LossKind(vespo_term, step_token_mean, False,
                      "detached Gamma weight of the sequence ratio x A x log p, `vespo_k_*`, `vespo_lambda_*`"),
}


def loss_kind(name: str) -> LossKind:
    """The registry's entry for `name`; an unknown name is a ValueError naming the known ones."""
    if name not in LOSS_KINDS:
        raise ValueError(f"unknown loss_type {name!r} (one of {', '.join(LOSS_KINDS)})")
    return LOSS_KINDS[name]


def loss_types_markdown() -> str:
    """docs/grpo.md's table of loss types, from `LOSS_KINDS`."""
    rows = "".join(f"| `{name}` | {kind.summary} |\n" for name, kind in LOSS_KINDS.items())
    return "| `loss_type` | the loss |\n|---|---|\n" + rows
