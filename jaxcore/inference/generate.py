"""Batched sampling with a preallocated KV cache.

Left-padded prompts are padded further to a length bucket (so new prompt lengths rarely
recompile), run through one jitted prefill, then a jitted `lax.while_loop` decode that owns the
donated cache and stops as soon as every row has finished.

Works for the plain `Transformer` and for an EGGROLL population (`jaxcore.es.eggroll.population`),
which is the same model with stand-in weights and rows grouped by member.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcore.inference.logprobs import token_logprobs
from jaxcore.inference.sampling import SamplingConfig, penalize_repetition, sample_next, seen_tokens
from jaxcore.model.lora import LoRAKernel
from jaxcore.model.transformer import KVCache, positions_from_mask

Array = jax.Array
# Powers of two and the halfway steps between them (each bucket at most 1.5x the one below): a prompt is padded
# by at most a third, where doubling padded a 9-token prompt to 16 and a 6-token one to 16 (prefill of the ES
# addition prompts at 60 rows on two CPU cores: 0.78 s at 16 columns, 0.33 s at 6). (The GRPO train step cuts
# its prompts to its own `prompt_width`.) A run still compiles one program per bucket its prompts reach.
PROMPT_BUCKETS = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                  6144, 8192)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GenerationResult:
    """Completions, prompt-major when num_return_sequences > 1 (the n samples of prompt 0 first)."""

    tokens: Array      # [R, max_new_tokens] int32, pad_token_id after the end
    logprobs: Array    # [R, max_new_tokens] float32 log p(token | prefix) under the raw logits; 0 after the end
    lengths: Array     # [R] generated tokens, EOS included
    finished: Array    # [R] bool: stopped at an EOS token

    @property
    def truncated(self) -> Array:
        """Rows that ran out of max_new_tokens without an EOS."""
        return ~self.finished


def bucket_length(length: int, buckets: Sequence[int] = PROMPT_BUCKETS) -> int:
    """The smallest bucket >= length (multiples of the largest bucket beyond it)."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    top = buckets[-1]
    return -(-length // top) * top


def prompt_bucket(length: int, room: int | None = None) -> int:
    """The columns a batch of prompts of `length` columns is padded to: its bucket (`bucket_length`), or `room`
    (the positions a model leaves a prompt) where the bucket would pass it, never fewer than `length`. The one
    prompt-bucket policy: single-turn rollouts, episodes and `generate` pad by it."""
    bucket = bucket_length(length)
    return bucket if room is None else max(length, min(bucket, room))


def pad_left(ids_BT: np.ndarray, mask_BT: np.ndarray, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad a batch to `length` columns."""
    extra = length - ids_BT.shape[1]
    if extra <= 0:
        return ids_BT, mask_BT
    return (np.pad(ids_BT, ((0, 0), (extra, 0)), constant_values=pad_id),
            np.pad(mask_BT, ((0, 0), (extra, 0)), constant_values=0))


def in_compute_dtype(model: nnx.Module) -> nnx.Module:
    """`model` with every floating weight in its compute dtype (`model.dtype`): itself when they all are, else a
    copy cast once (so the decode loop streams half the bytes in bf16, and no step casts them again)."""
    if all(x.dtype == model.dtype for x in jax.tree.leaves(model) if jnp.issubdtype(x.dtype, jnp.floating)):
        return model
    return _cast_floating(model, model.dtype)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _cast_floating(model: nnx.Module, dtype: Any) -> nnx.Module:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, model)


# The jitted functions below take the model itself: flax modules are pytrees, so jit flattens one in ~1 ms where
# `nnx.split` took 11 ms on SmolLM2-135M and its graphdef, a static argument, was hashed at every call.
@functools.partial(jax.jit, static_argnames=("cache_length", "repeats"))
def prefill(model: nnx.Module, ids_BT: Array, mask_BT: Array, cache_length: int, repeats: int = 1
            ) -> tuple[Array, KVCache]:
    """One jitted forward of left-padded prompts into a fresh KV cache of `cache_length` slots: the logits after
    each row's last token, and the cache (slots from `ids_BT.shape[1]` on free). With `repeats=n` both come back
    with every row repeated n times (prompt-major, as `np.repeat`): n samples of a prompt share one prefill.
    One program per (model structure, shapes, cache_length, repeats)."""
    cache = KVCache.create(model.config, ids_BT.shape[0], cache_length, model.dtype)
    logits_B1V, cache = model.forward_cached(ids_BT, positions_from_mask(mask_BT), mask_BT, cache,
                                             jnp.int32(0), last_only=True)
    if repeats == 1:
        return logits_B1V[:, 0], cache
    return jax.tree.map(lambda x_B: jnp.repeat(x_B, repeats, axis=0), (logits_B1V[:, 0], cache))


def shares_prefill(model: nnx.Module) -> bool:
    """Whether each row's outputs depend on its own tokens only, so that repeated prompts can share one prefill:
    every weight a plain array or a LoRA stand-in without dropout. Any other stand-in (an EGGROLL population's
    ties rows to members by their position in the batch) does not."""
    values = (v.get_value() for v in jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    return all(isinstance(v, jax.Array) or (isinstance(v, LoRAKernel) and (v.key is None or v.dropout == 0.0))
               for v in values)


def place_rows(x_B: np.ndarray, row_sharding: jax.sharding.Sharding | None) -> Array:
    """A host batch (the same on every process) as one global array placed with `row_sharding`."""
    if row_sharding is None:
        return jnp.asarray(x_B)
    return jax.make_array_from_callback(x_B.shape, row_sharding, lambda index: x_B[index])


def row_shards(row_sharding: jax.sharding.Sharding | None) -> int:
    """How many pieces `row_sharding` cuts the rows (leading axis) into: 1 for none, a single device or
    replicated rows, else the product of the mesh axes its spec puts on the leading dimension."""
    spec = getattr(row_sharding, "spec", ())
    axes = spec[0] if len(spec) else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([row_sharding.mesh.shape[a] for a in axes]))


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "sampling", "eos_ids", "pad_id", "with_logprobs"),
                   donate_argnames=("cache",))
def decode(model: nnx.Module, cache: KVCache, logits_BV: Array, next_position_B: Array,
           start_index: Array, key: Array, *, max_new_tokens: int, sampling: SamplingConfig,
           eos_ids: tuple[int, ...], pad_id: int, with_logprobs: bool = True, seen_BV: Array | None = None
           ) -> tuple[GenerationResult, KVCache]:
    """The jitted decode loop: up to `max_new_tokens` tokens per row sampled from `logits_BV` on, each written to
    the (donated) cache at slot `start_index + step` with position `next_position_B + step`; stops when every
    row has emitted an EOS. Returns the tokens and the cache (`jaxcore.agents` keeps it across turns). Without
    `with_logprobs` the logprobs stay 0 (a log-sum-exp over the vocabulary per step saved). With
    `sampling.repetition_penalty` != 1, `seen_BV` holds the tokens each row has seen (`sampling.seen_tokens`), and
    every sampled one joins them; the logprobs stay the model's own (before the penalty: the policy's, as a
    training forward computes them)."""
    rows = logits_BV.shape[0]
    eos_E = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)
    penalized = sampling.repetition_penalty != 1.0
    if penalized and seen_BV is None:
        raise ValueError("a repetition penalty needs seen_BV, the tokens each row has seen")
    seen_BV = seen_BV if penalized else jnp.zeros((rows, 1), bool)          # carried only where it is read

    def emit(step, logits_BV, done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV):
        drawn_from_BV = penalize_repetition(logits_BV, seen_BV, sampling.repetition_penalty) if penalized else logits_BV
        token_B = sample_next(drawn_from_BV, jax.random.fold_in(key, step), sampling)
        logprob_B = (token_logprobs(logits_BV[:, None], token_B[:, None])[:, 0] if with_logprobs
                     else jnp.zeros(token_B.shape, jnp.float32))
        token_B = jnp.where(done_B, pad_id, token_B)
        tokens_BN = tokens_BN.at[:, step].set(token_B)
        logprobs_BN = logprobs_BN.at[:, step].set(jnp.where(done_B, 0.0, logprob_B))
        lengths_B = lengths_B + (~done_B).astype(jnp.int32)
        now_done_B = done_B | jnp.isin(token_B, eos_E)
        if penalized:
            seen_BV = seen_BV.at[jnp.arange(rows), token_B].set(True)
        return token_B, now_done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV

    def body(carry):
        step, cache, logits_BV, done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV = carry
        token_B, now_done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV = emit(
            step, logits_BV, done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV)
        logits_B1V, cache = model.forward_cached(
            token_B[:, None], (next_position_B + step)[:, None], (~done_B)[:, None], cache,
            start_index + step, last_only=True)
        return step + 1, cache, logits_B1V[:, 0], now_done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV

    def keep_going(carry):
        step, done_B = carry[0], carry[3]
        return (step < max_new_tokens - 1) & ~jnp.all(done_B)

    init = (jnp.int32(0), cache, logits_BV, jnp.zeros(rows, bool), jnp.zeros(rows, jnp.int32),
            jnp.full((rows, max_new_tokens), pad_id, jnp.int32), jnp.zeros((rows, max_new_tokens), jnp.float32),
            seen_BV)
    step, cache, logits_BV, done_B, lengths_B, tokens_BN, logprobs_BN, seen_BV = jax.lax.while_loop(
        keep_going, body, init)
    _, done_B, lengths_B, tokens_BN, logprobs_BN, _ = emit(step, logits_BV, done_B, lengths_B, tokens_BN,
                                                           logprobs_BN, seen_BV)
    # Returning the cache lets XLA alias the donated input buffers (no copy into the loop state).
    return GenerationResult(tokens_BN, logprobs_BN, lengths_B, done_B), cache


def generate(model: nnx.Module, input_ids_BT: Any, attention_mask_BT: Any, *, max_new_tokens: int,
             sampling: SamplingConfig | None = None, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
             eos_token_ids: Sequence[int] = (), num_return_sequences: int = 1,
             key: Array | None = None, pad_token_id: int = 0, row_sharding: jax.sharding.Sharding | None = None,
             logprobs: bool = True) -> GenerationResult:
    """Sample `max_new_tokens` per row after left-padded prompts.

    The sampling settings come as one `SamplingConfig` (`sampling`), or as transformers' keyword arguments
    (`temperature`, `top_k`, ...; not both). `temperature=0` is greedy. Filters apply in transformers' order
    (repetition penalty, temperature, top-k, top-p, min-p). With `num_return_sequences=n` every prompt is sampled
    n times, rows prompt-major. `row_sharding` optionally places the rows on a mesh (e.g. sharded over a data
    axis).
    `logprobs=False` leaves `result.logprobs` at 0 and skips computing them (as HF's `output_scores=False`).
    """
    keywords = SamplingConfig(temperature, top_k, top_p, min_p, repetition_penalty)
    if sampling is not None and keywords != SamplingConfig():
        raise ValueError("give the sampling settings as sampling= or as keyword arguments, not both")
    sampling = sampling if sampling is not None else keywords
    ids_BT, mask_BT = np.asarray(input_ids_BT, np.int32), np.asarray(attention_mask_BT, np.int32)
    if ids_BT.ndim != 2 or ids_BT.shape != mask_BT.shape:
        raise ValueError(f"input_ids {ids_BT.shape} and attention_mask {mask_BT.shape} must both be [B, T]")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be >= 1, got {num_return_sequences}")
    if (mask_BT.sum(-1) == 0).any():
        raise ValueError(f"prompt rows {np.flatnonzero(mask_BT.sum(-1) == 0).tolist()} are empty (all padding)")
    if (mask_BT[:, -1] == 0).any():
        raise ValueError("prompts must be left-padded (attention_mask[:, -1] must be 1)")
    config = model.config
    seen_BV = None
    if sampling.repetition_penalty != 1.0:          # each row's tokens, as transformers' input_ids hold them
        seen_BV = seen_tokens([row[m.astype(bool)] for row, m in zip(ids_BT, mask_BT)], config.vocab_size)
    length = prompt_bucket(ids_BT.shape[1])
    longest = int(mask_BT.sum(-1).max())        # positions come from the mask: the bucket's padding takes none
    if longest + max_new_tokens > config.max_position_embeddings and config.learned_positions:
        raise ValueError(f"prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                         f"{config.max_position_embeddings} learned positions")
    ids_BT, mask_BT = pad_left(ids_BT, mask_BT, length, pad_token_id)
    # n samples of a prompt share its prefill unless the model ties rows to their batch position or the distinct
    # prompts cannot be sharded like the repeated rows (then every repeated row is prefilled, as before)
    n = num_return_sequences
    repeats = n if shares_prefill(model) and ids_BT.shape[0] % row_shards(row_sharding) == 0 else 1
    if n > repeats:
        ids_BT, mask_BT = np.repeat(ids_BT, n, axis=0), np.repeat(mask_BT, n, axis=0)
    ids, mask = place_rows(ids_BT, row_sharding), place_rows(mask_BT, row_sharding)
    model = in_compute_dtype(model)                 # once per call, not in every decode step
    logits_BV, cache = prefill(model, ids, mask, cache_length=length + max_new_tokens, repeats=repeats)
    next_position_B = place_rows(np.repeat(mask_BT.sum(-1, dtype=np.int32), repeats), row_sharding)
    if seen_BV is not None:
        seen_BV = place_rows(np.repeat(np.repeat(seen_BV, n, axis=0) if n > repeats else seen_BV, repeats, axis=0),
                             row_sharding)
    result, _ = decode(model, cache, logits_BV, next_position_B, jnp.int32(length),
                       key if key is not None else jax.random.key(0), max_new_tokens=max_new_tokens,
                       sampling=sampling, eos_ids=tuple(int(e) for e in eos_token_ids), pad_id=int(pad_token_id),
                       with_logprobs=logprobs, seen_BV=seen_BV)
    return result
