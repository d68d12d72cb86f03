"""Statistics of rewards of any finite size in float32.

A reward of 1e20 is finite in float32, but its square is not, so a z-score or a standard deviation of such rewards
comes out inf or NaN and the update silently vanishes. Dividing the rewards by a power of two first keeps every
square finite, and the division is exact: where the rewards are already small enough the scale is 1 and the numbers
are bit for bit those of the plain formula (TRL's and the torch reference's).

The power of two is taken per slice that a statistic runs over (a group for a group's mean and std, the whole batch
for a batch's), so that one huge reward leaves every other group in units of 1: in the batch's units their
deviations would square below float32's normal range and flush to 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LARGEST_EXPONENT = 50           # |reward / scale| <= 2**50: squares summed over 2**20 rows stay below float32's max


def power_of_two_scale(x: jax.Array, axis: int | None = None) -> jax.Array:
    """2**k, k >= 0, the smallest making every finite |x| / 2**k at most 2**LARGEST_EXPONENT (NaNs ignored); one per
    slice along `axis` (kept, of length 1), or one for all of x where `axis` is None (every axis kept)."""
    biggest = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), axis=axis, keepdims=True, initial=1.0)
    exponent = jnp.maximum(jnp.ceil(jnp.log2(biggest)) - LARGEST_EXPONENT, 0).astype(jnp.int32)
    return jnp.ldexp(jnp.ones_like(biggest), exponent)


def in_units(x: jax.Array, axis: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(x / unit, unit), unit = `power_of_two_scale(x, axis)`, with a constant slice (NaNs ignored) as zeros: for
    statistics that do not depend on where zero is (deviations from a mean, a variance).

    The float32 mean of equal values can round by an ulp, and once that ulp passes the formulas' epsilons (large
    rewards, and always in units of 2**k > 1) a constant slice gets advantages or z-scores of +-1 (TRL's formula
    does so too). Measured from its own value, a constant slice is exactly 0 at every magnitude; every other slice
    keeps the plain formula's numbers, bit for bit.
    """
    unit = power_of_two_scale(x, axis)
    y = x / unit
    scored = ~jnp.isnan(y)
    low = jnp.min(jnp.where(scored, y, jnp.inf), axis=axis, keepdims=True)
    high = jnp.max(jnp.where(scored, y, -jnp.inf), axis=axis, keepdims=True)
    return y - jnp.where(low == high, low, 0.0), unit
