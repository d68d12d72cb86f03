"""One decode step's attention as one kernel: RoPE on the new query and key, the KV-cache write and attention over
the cache, fused in a Pallas kernel (Triton lowering: A100 and H100), beside the XLA path it replaces
(`Attention.__call__`: `rotate`, two `dynamic_update_slice`s and `grouped_attention`, seven kernels a layer on a GPU).

A decode step is bound by per-kernel cost on a GPU, not bytes: this kernel reads each row's cache once and writes
only the new slot. Each program handles one (row, kv head): its G query heads against the cache's S slots, in
blocks of `BLOCK_S` slots with a running (online) softmax, so that any cache length fits in registers. The
numbers follow the XLA path's: logits in float32 from compute-dtype operands, masked slots at float32's lowest
value (a row with no visible slot averages them, as the XLA path does), the weights cast to the values' dtype for
the product. The kernel runs on the CPU with `interpret=True`, which is how the tests hold it to the XLA path.

Shape suffixes: B rows, K kv heads, G query heads per kv head, E head dim, S cache slots.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
PATHS = ("auto", "xla", "pallas", "pallas_interpret")   # Transformer.use_decode_attention
ENV = "JAXCORE_DECODE_ATTENTION"    # the path "auto" takes in this process, where set
BLOCK_S = 32                        # cache slots per step of the running softmax (a power of two, as Triton needs)


def chosen_path(path: str) -> str:
    """The path a setting runs: "auto" is the fused kernel where JAX's backend is a GPU and XLA's elsewhere (on
    the CPU the XLA path is the faster one), unless the environment variable `ENV` names a path for every "auto"
    model of the process (a run started from the command line has no other switch); "pallas_interpret" is the
    kernel interpreted on any backend (tests)."""
    if path == "auto":
        path = os.environ.get(ENV, "auto") or "auto"
        if path not in PATHS:
            raise ValueError(f"{ENV}={path!r}; choose from {', '.join(PATHS)}")
    if path not in PATHS:
        raise ValueError(f"decode_attention={path!r}; choose from {', '.join(PATHS)}")
    if path == "auto":
        return "pallas" if jax.default_backend() in ("gpu", "cuda") else "xla"
    return path


def fits(head_dim: int) -> bool:
    """Whether the kernel takes heads of this width: a power of two of at least 16 (Triton's blocks are powers of
    two, and RoPE splits the head in halves); other widths run the XLA path."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def _rotated(x1: Array, x2: Array, cos: Array, sin: Array) -> tuple[Array, Array]:
    """HF's half-split rotation of (x1, x2), the two halves of the head dim, in float32."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


def _kernel(index_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, cos_ref: Any, sin_ref: Any, mask_ref: Any,
            k_cache_ref: Any, v_cache_ref: Any, out_ref: Any, k_out_ref: Any, v_out_ref: Any, *,
            scale: float, slots: int, rope: bool) -> None:
    """One (row, kv head): the head dim is handled as its two halves throughout (RoPE pairs them), which keeps
    every block a power of two wide and needs no concatenation."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    del k_cache_ref, v_cache_ref                         # aliased with k_out_ref / v_out_ref
    f32, compute = jnp.float32, q_ref.dtype
    half = q_ref.shape[-1] // 2
    first, second = pl.ds(0, half), pl.ds(half, half)
    index = index_ref[0]
    q1_GH, q2_GH = q_ref[:, first].astype(f32), q_ref[:, second].astype(f32)
    k1_H, k2_H = k_ref[first].astype(f32), k_ref[second].astype(f32)
    if rope:
        cos_H, sin_H = cos_ref[first], sin_ref[first]
        q1_GH, q2_GH = _rotated(q1_GH, q2_GH, cos_H[None], sin_H[None])
        k1_H, k2_H = _rotated(k1_H, k2_H, cos_H, sin_H)
    q1_GH, q2_GH = q1_GH.astype(compute).astype(f32), q2_GH.astype(compute).astype(f32)
    cache = k_out_ref.dtype
    k1_H, k2_H = k1_H.astype(cache), k2_H.astype(cache)
    v_new_E = v_ref[...].astype(cache)
    k_out_ref[first, pl.ds(index, 1)] = k1_H[:, None]
    k_out_ref[second, pl.ds(index, 1)] = k2_H[:, None]
    v_out_ref[pl.ds(index, 1), :] = v_new_E[None, :]
    lowest = jnp.finfo(f32).min

    def keys(part: Any, new_H: Array, start: Array, slot_S: Array, inside_S: Array) -> Array:
        keys_HS = plgpu.load(k_out_ref.at[part, pl.ds(start, BLOCK_S)], mask=inside_S[None, :], other=0)
        return jnp.where(slot_S[None, :] == index, new_H[:, None], keys_HS).astype(compute).astype(f32)

    def step(block: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        max_G, sum_G, acc_GE = carry
        start = block * BLOCK_S
        slot_S = start + jnp.arange(BLOCK_S)
        inside_S = slot_S < slots
        k1_HS, k2_HS = keys(first, k1_H, start, slot_S, inside_S), keys(second, k2_H, start, slot_S, inside_S)
        values_SE = plgpu.load(v_out_ref.at[pl.ds(start, BLOCK_S), :], mask=inside_S[:, None], other=0)
        values_SE = jnp.where(slot_S[:, None] == index, v_new_E[None, :], values_SE).astype(compute)
        visible_S = plgpu.load(mask_ref.at[pl.ds(start, BLOCK_S)], mask=inside_S, other=0) != 0
        logits_GS = (jnp.sum(q1_GH[:, :, None] * k1_HS[None], axis=1)
                     + jnp.sum(q2_GH[:, :, None] * k2_HS[None], axis=1)) * scale
        logits_GS = jnp.where(visible_S[None, :], logits_GS, lowest)
        logits_GS = jnp.where(inside_S[None, :], logits_GS, -jnp.inf)       # padding slots weigh nothing
        new_max_G = jnp.maximum(max_G, jnp.max(logits_GS, axis=-1))
        rescale_G = jnp.exp(max_G - new_max_G)
        weights_GS = jnp.exp(logits_GS - new_max_G[:, None])
        sum_G = sum_G * rescale_G + jnp.sum(weights_GS, axis=-1)
        product_GE = jnp.sum(weights_GS.astype(compute).astype(f32)[:, :, None] * values_SE.astype(f32)[None],
                             axis=1)
        return new_max_G, sum_G, acc_GE * rescale_G[:, None] + product_GE

    g, e = q_ref.shape
    init = (jnp.full((g,), -jnp.inf, f32), jnp.zeros((g,), f32), jnp.zeros((g, e), f32))
    _, sum_G, acc_GE = jax.lax.fori_loop(0, -(-slots // BLOCK_S), step, init)
    out_ref[...] = (acc_GE / sum_G[:, None]).astype(out_ref.dtype)


def fused_decode_attention(q_BKGE: Array, k_BKE: Array, v_BKE: Array, cos_BE: Array | None, sin_BE: Array | None,
                           mask_BS: Array, k_cache_BKES: Array, v_cache_BKSE: Array, index: Array, *, scale: float,
                           interpret: bool = False) -> tuple[Array, Array, Array]:
    """The new token's attention output [B, K, G, E], and the caches with its key (rotated) and value at slot
    `index`. `q_BKGE`, `k_BKE`: before RoPE; `cos_BE`/`sin_BE`: the new positions' rotary tables (None without
    RoPE); `mask_BS`: which slots the new token sees (its own included).

    The query, key and value reach the kernel as one array (a kv head's G queries padded to a power of two, as
    Triton's blocks must be, then every key, then every value): XLA then writes the projections' output once
    rather than once per part."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    b, k, g, e = q_BKGE.shape
    slots = k_cache_BKES.shape[-1]
    rope = cos_BE is not None
    if not rope:
        cos_BE = sin_BE = jnp.zeros((b, e), jnp.float32)
    g_pad = 1 << (g - 1).bit_length()
    q_BKPE = jnp.pad(q_BKGE, ((0, 0), (0, 0), (0, g_pad - g), (0, 0)))
    dtype = q_BKGE.dtype
    qkv_BRE = jnp.concatenate([q_BKPE.reshape(b, k * g_pad, e), k_BKE.astype(dtype), v_BKE.astype(dtype)], axis=1)
    padded = pl.cdiv(slots, BLOCK_S) * BLOCK_S
    kernel = functools.partial(_kernel, scale=scale, slots=slots, rope=rope)
    params = {} if interpret else {"compiler_params": plgpu.CompilerParams(num_warps=4, num_stages=1)}
    out_BKPE, k_cache_BKES, v_cache_BKSE = pl.pallas_call(
        kernel,
        grid=(b, k),
        in_specs=[
            pl.BlockSpec((1,), lambda i, j: (0,)),
            pl.BlockSpec((None, g_pad, e), lambda i, j: (i, j, 0)),                   # rows of qkv: the queries
            pl.BlockSpec((None, None, e), lambda i, j: (i, k * g_pad + j, 0)),        # the key
            pl.BlockSpec((None, None, e), lambda i, j: (i, k * g_pad + k + j, 0)),    # the value
            pl.BlockSpec((None, e), lambda i, j: (i, 0)),
            pl.BlockSpec((None, e), lambda i, j: (i, 0)),
            pl.BlockSpec((None, padded), lambda i, j: (i, 0)),
            pl.BlockSpec((None, None, e, padded), lambda i, j: (i, j, 0, 0)),
            pl.BlockSpec((None, None, padded, e), lambda i, j: (i, j, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, g_pad, e), lambda i, j: (i, j, 0, 0)),
            pl.BlockSpec((None, None, e, padded), lambda i, j: (i, j, 0, 0)),
            pl.BlockSpec((None, None, padded, e), lambda i, j: (i, j, 0, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((b, k, g_pad, e), dtype),
                   jax.ShapeDtypeStruct(k_cache_BKES.shape, k_cache_BKES.dtype),
                   jax.ShapeDtypeStruct(v_cache_BKSE.shape, v_cache_BKSE.dtype)],
        input_output_aliases={7: 1, 8: 2},
        interpret=interpret,
        name="decode_attention",
        **params,
    )(jnp.reshape(index, (1,)).astype(jnp.int32), qkv_BRE, qkv_BRE, qkv_BRE, cos_BE.astype(jnp.float32),
      sin_BE.astype(jnp.float32), mask_BS.astype(jnp.int32), k_cache_BKES, v_cache_BKSE)
    return out_BKPE[:, :, :g], k_cache_BKES, v_cache_BKSE
