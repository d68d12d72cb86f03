"""Rotary position embeddings (HF's half-split layout): each layer's inverse frequencies, the cos/sin tables of a
batch's positions, and the rotation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.model.config import ModelConfig

Array = jax.Array
Rope = tuple[Array, Array]          # cos and sin [B, T, 1, E] of the rotary angles (rope_tables)


def rope_inverse_frequencies(config: ModelConfig, layer: int = 0) -> np.ndarray:
    """Inverse RoPE frequencies [E/2] of layer `layer` in float32, including HF's `linear` and `llama3` scaling."""
    dim = config.head_dim
    theta, params = config.layer_rope(layer)
    # torch's float32 `base ** t` is (nearly always) the correctly rounded power, which numpy's float32 pow is not
    # (1 ulp off in ~10% of entries): the power in float64 rounded to float32, then 1 / it in float32, as HF.
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = np.float32(1.0) / (np.float64(theta) ** exponent.astype(np.float64)).astype(np.float32)
    rope_type = params.get("rope_type", "default")
    if rope_type == "linear":
        return (inv_freq / np.float32(params["factor"])).astype(np.float32)
    if rope_type == "llama3":
        factor = params["factor"]
        low, high = params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def rope_tables(positions_BT: Array, inv_freq: np.ndarray, positions_below: int | None = None) -> Rope:
    """cos and sin [B, T, 1, E] of the rotary angles (positions * inverse frequencies, in float32), HF's
    half-split layout.

    With `positions_below` (a bound on every position), cos and sin are computed once per position and gathered:
    XLA:CPU fuses them into every layer's rotation, forward and backward, and evaluates them there once per head
    (an optimisation barrier does not stop it), which costs a twentieth of a CPU training step."""
    def angles(positions: Array) -> Array:
        angles_e = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
        return jnp.concatenate([angles_e, angles_e], axis=-1)
    if positions_below is None:
        angles_BTE = angles(positions_BT)
        cos_BTE, sin_BTE = jnp.cos(angles_BTE), jnp.sin(angles_BTE)
    else:
        angles_PE = angles(jnp.arange(positions_below))
        cos_BTE, sin_BTE = jnp.cos(angles_PE)[positions_BT], jnp.sin(angles_PE)[positions_BT]
    return cos_BTE[:, :, None, :], sin_BTE[:, :, None, :]


def rotate(x_BTHE: Array, rope: Rope) -> Array:
    """Rotary embedding from `rope_tables`, computed in float32 (float64 stays float64)."""
    cos_BT1E, sin_BT1E = rope
    x = x_BTHE.astype(jnp.promote_types(x_BTHE.dtype, jnp.float32))
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos_BT1E + rotated * sin_BT1E).astype(x_BTHE.dtype)
