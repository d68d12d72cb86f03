"""Statistics of rewards of any finite size in float32.

A reward of 1e20 is finite in float32, but its square is not, so a z-score or a standard deviation of such rewards
comes out inf or NaN and the update silently vanishes. Dividing the rewards by a power of two first keeps every
square finite, and the division is exact: where the rewards are already small enough the scale is 1 and the numbers
are bit for bit those of the plain formula (TRL's and the torch reference's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LARGEST_EXPONENT = 50           # |reward / scale| <= 2**50: squares summed over 2**20 rows stay below float32's max


def power_of_two_scale(x: jax.Array) -> jax.Array:
    """2**k, k >= 0, the smallest making every finite |x| / 2**k at most 2**LARGEST_EXPONENT (NaNs ignored)."""
    biggest = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), initial=1.0)
    exponent = jnp.maximum(jnp.ceil(jnp.log2(biggest)) - LARGEST_EXPONENT, 0).astype(jnp.int32)
    return jnp.ldexp(jnp.ones((), x.dtype), exponent)
