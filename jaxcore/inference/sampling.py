"""Next-token sampling with transformers' filters, in transformers' order.

repetition penalty -> temperature -> top-k -> top-p -> min-p, each exactly as the HF logits processors compute it
(`RepetitionPenaltyLogitsProcessor`, `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`,
`MinPLogitsWarper`, min_tokens_to_keep=1). `temperature == 0` means greedy (argmax of the logits, after the
repetition penalty as in transformers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np
from annotated_types import Ge, Gt, Interval

from jaxcore.config.schema import Checked

Array = jax.Array


# Hashed by value, so that a jitted sampler specialises on the settings (`generate` builds its own instance
# per call; a training job's `rollout:` section extends this class).
@dataclasses.dataclass(unsafe_hash=True)
class SamplingConfig(Checked):
    """Sampling settings (transformers' names; temperature 0 is greedy; ranges checked on construction)."""

    temperature: Annotated[float, Ge(0)] = 1.0
    top_k: Annotated[int, Ge(0)] = 0                    # 0: no top-k filter
    top_p: Annotated[float, Interval(gt=0, le=1)] = 1.0
    min_p: Annotated[float, Interval(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Gt(0)] = 1.0   # 1: none; > 1 makes tokens already in the row less likely

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def penalize_repetition(logits_BV: Array, seen_BV: Array, penalty: float) -> Array:
    """transformers' RepetitionPenaltyLogitsProcessor: the logit of each token already in the row (`seen_BV`)
    divided by `penalty` where positive, multiplied by it where negative."""
    penalized_BV = jnp.where(logits_BV < 0, logits_BV * penalty, logits_BV / penalty)
    return jnp.where(seen_BV, penalized_BV, logits_BV)


def seen_tokens(rows: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """[B, V] bool: the tokens of each row, its left padding left out (as transformers' generate does)."""
    seen_BV = np.zeros((len(rows), vocab_size), bool)
    for i, row in enumerate(rows):
        seen_BV[i, np.asarray(row, np.int64)] = True
    return seen_BV


def filter_logits(logits_BV: Array, cfg: SamplingConfig) -> Array:
    """Apply temperature, top-k, top-p and min-p; removed tokens get -inf."""
    scores = logits_BV.astype(jnp.float32)
    if cfg.temperature != 1.0:
        scores = scores / cfg.temperature
    if cfg.top_k > 0:
        k = min(cfg.top_k, scores.shape[-1])
        kth_B1 = jax.lax.top_k(scores, k)[0][..., -1:]
        scores = jnp.where(scores < kth_B1, -jnp.inf, scores)
    if cfg.top_p < 1.0:
        order_BV = jnp.argsort(scores, axis=-1)                     # ascending, as HF sorts
        sorted_BV = jnp.take_along_axis(scores, order_BV, axis=-1)
        cumulative_BV = jnp.cumsum(jax.nn.softmax(sorted_BV, axis=-1), axis=-1)
        remove_sorted_BV = (cumulative_BV <= 1.0 - cfg.top_p).at[..., -1].set(False)
        rows_B1 = jnp.arange(scores.shape[0])[:, None]
        remove_BV = jnp.zeros_like(remove_sorted_BV).at[rows_B1, order_BV].set(remove_sorted_BV)
        scores = jnp.where(remove_BV, -jnp.inf, scores)
    if cfg.min_p > 0.0:
        probs_BV = jax.nn.softmax(scores, axis=-1)
        threshold_B1 = cfg.min_p * probs_BV.max(-1, keepdims=True)
        scores = jnp.where(probs_BV < threshold_B1, -jnp.inf, scores)
    return scores


ARGMAX_CHUNK = 256


def _max_keeping_nan(x_BCK: Array) -> Array:
    """Max over the last axis, NaN where there is one (XLA:CPU's own max may drop NaNs; argmax never does)."""
    def keep(a: Array, b: Array) -> Array:
        return jnp.where(jnp.isnan(a) | (a > b), a, b)

    return jax.lax.reduce(x_BCK, jnp.array(-jnp.inf, x_BCK.dtype), keep, (x_BCK.ndim - 1,))


def first_argmax(x_BV: Array) -> Array:
    """`jnp.argmax(x_BV, axis=-1)` (the first maximum; the first NaN where there is one) in two cheap passes.

    XLA:CPU compiles argmax to one (value, index) reduction that does not vectorise, a visible share of a decode
    step over a large vocabulary. Here: the maximum of each chunk of 256, the first chunk holding the maximum,
    then the first maximum inside that chunk, each pass vectorised.
    """
    chunked_BCK = in_chunks(x_BV, -jnp.inf)
    chunk_B = jnp.argmax(_max_keeping_nan(chunked_BCK), axis=-1)
    within_BK = chunk_of(chunked_BCK, chunk_B)
    return (chunk_B * ARGMAX_CHUNK + jnp.argmax(within_BK, axis=-1)).astype(jnp.int32)


def in_chunks(x_BV: Array, fill: float) -> Array:
    """[B, V] as [B, C, ARGMAX_CHUNK], the last chunk padded with `fill`."""
    rows, vocab = x_BV.shape
    chunks = -(-vocab // ARGMAX_CHUNK)
    padded_BV = jnp.pad(x_BV, ((0, 0), (0, chunks * ARGMAX_CHUNK - vocab)), constant_values=fill)
    return padded_BV.reshape(rows, chunks, ARGMAX_CHUNK)


def chunk_of(x_BCK: Array, chunk_B: Array) -> Array:
    """Each row's chunk `chunk_B` [B, ARGMAX_CHUNK]."""
    return jnp.take_along_axis(x_BCK, chunk_B[:, None, None], axis=1)[:, 0]


def last_nonzero(weights_BN: Array) -> Array:
    """Index of each row's last positive entry."""
    return weights_BN.shape[-1] - 1 - jnp.argmax(weights_BN[:, ::-1] > 0, axis=-1)


def inverse_cdf_draw(scores_BV: Array, uniform_B: Array) -> Array:
    """One token per row from softmax(scores_BV): the first token whose cumulative probability exceeds the row's
    number in [0, 1), found in two cheap passes (which chunk of `ARGMAX_CHUNK` tokens, then where inside it).

    `sample_next` draws one uniform number per row. The Gumbel-max draw (`jax.random.categorical`) makes one per
    row and token, several times the cost of this draw over a large vocabulary on a CPU. Tokens the filters
    removed (-inf) have probability 0 and are never drawn; where scores reach +inf (a temperature near 0), the
    draw is among those tokens.
    """
    finite_BV = jnp.minimum(scores_BV, jnp.finfo(jnp.float32).max)      # +inf (a temperature near 0): the largest
    weights_BCK = in_chunks(jnp.exp(finite_BV - jnp.max(finite_BV, axis=-1, keepdims=True)), 0.0)
    chunk_weights_BC = jnp.sum(weights_BCK, axis=-1)
    cumulative_BC = jnp.cumsum(chunk_weights_BC, axis=-1)
    target_B1 = uniform_B[:, None].astype(jnp.float32) * cumulative_BC[:, -1:]
    # the first chunk whose cumulative weight exceeds the target (where rounding lets none, the last nonzero one)
    chunk_B = jnp.minimum(jnp.sum(cumulative_BC <= target_B1, axis=-1), last_nonzero(chunk_weights_BC))
    before_B1 = jnp.take_along_axis(jnp.pad(cumulative_BC, ((0, 0), (1, 0))), chunk_B[:, None], axis=1)
    within_BK = chunk_of(weights_BCK, chunk_B)
    passed_BK = before_B1 + jnp.cumsum(within_BK, axis=-1) <= target_B1
    index_B = jnp.minimum(jnp.sum(passed_BK, axis=-1), last_nonzero(within_BK))
    return (chunk_B * ARGMAX_CHUNK + index_B).astype(jnp.int32)


def sample_next(logits_BV: Array, key: Array, cfg: SamplingConfig) -> Array:
    """One token per row: argmax when greedy, else a draw from the filtered distribution (`inverse_cdf_draw`)."""
    if cfg.greedy:
        return first_argmax(logits_BV)
    return inverse_cdf_draw(filter_logits(logits_BV, cfg), jax.random.uniform(key, logits_BV.shape[:1]))
