"""ES fitness shaping by name (`es.shaping`), one registry entry per mode: the config's `Shaping`, the update
(`jaxcore.es.eggroll.es_step`) and the error for an unknown name all read `SHAPERS`.

Shapes: N fitness values (members, or members x prompts for the grouped mode).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxcore.runtime.reward_scale import in_units

Array = jax.Array


def centered_ranks(x_N: Array) -> Array:
    """Ranks mapped linearly to [-0.5, 0.5]; tied values share their average rank."""
    n = x_N.shape[0]
    below = (x_N[None, :] < x_N[:, None]).sum(1)
    equal = (x_N[None, :] == x_N[:, None]).sum(1)
    rank = below + (equal - 1) / 2.0
    return rank / max(n - 1, 1) - 0.5


def _over_std(centred_N: Array, unit_N: Array, f_N: Array) -> Array:
    """`centred_N` (in units of `unit_N`) over sqrt(var(f) + 1e-5), the variance in f's own power of two
    (`in_units`): finite for f ~ 1e20, exactly 0 for a constant f of any size. The 1e-5 in those units is
    kept at least float32's smallest normal number: below it (f past ~1e32) it would flush to 0 and 0 / 0 be NaN."""
    y_N, unit = in_units(f_N)
    floor = jnp.maximum(1e-5 / (unit * unit), jnp.finfo(jnp.float32).tiny)
    return centred_N * (unit_N / unit) / jnp.sqrt(y_N.var() + floor)


def zscore(f_N: Array, group_size: int | None) -> Array:
    """(f - mean) / sqrt(var + 1e-5)."""
    y_N, unit = in_units(f_N)
    return _over_std(y_N - y_N.mean(), unit, f_N)


def group_zscore(f_N: Array, group_size: int | None) -> Array:
    """Each group of `group_size` consecutive entries minus its mean (in the group's own power of two: one huge
    group leaves the others' deviations alone), over the global std."""
    if not group_size or f_N.shape[0] % group_size:
        raise ValueError(f"group_zscore needs a group_size dividing {f_N.shape[0]}, got {group_size}")
    y_NG, unit_N1 = in_units(f_N.reshape(-1, group_size), axis=1)
    return _over_std((y_NG - y_NG.mean(1, keepdims=True)).reshape(-1), jnp.repeat(unit_N1[:, 0], group_size), f_N)


def centered_rank(f_N: Array, group_size: int | None) -> Array:
    """Ranks in [-0.5, 0.5]."""
    return centered_ranks(f_N)


def unshaped(f_N: Array, group_size: int | None) -> Array:
    """f unchanged."""
    return f_N


SHAPERS: dict[str, Callable[[Array, int | None], Array]] = {
    "zscore": zscore, "group_zscore": group_zscore, "centered_rank": centered_rank, "none": unshaped,
}


def shape_fitness(fitness_N: Any, mode: str = "zscore", group_size: int | None = None) -> Array:
    """`fitness_N` shaped by `mode` (a name of `SHAPERS`; `group_size` for group_zscore)."""
    if mode not in SHAPERS:
        raise ValueError(f"unknown fitness shaping {mode!r}; choose from {', '.join(SHAPERS)}")
    return SHAPERS[mode](jnp.asarray(fitness_N, jnp.float32), group_size)
