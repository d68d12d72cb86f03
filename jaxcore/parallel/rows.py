"""Rows of a batch sharded over processes: the rows this process holds, a host array summed over processes,
and a row-sharded array gathered in full."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def local_rows(array: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, host values) of the rows of a row-sharded global array this process holds."""
    shards = sorted({s.index[0].start or 0: s for s in array.addressable_shards}.items())
    rows = np.concatenate([np.arange(start, start + s.data.shape[0]) for start, s in shards])
    return rows, np.concatenate([np.asarray(s.data) for _, s in shards])


def allgather_sum(values: np.ndarray) -> np.ndarray:
    """Sum a host array over processes (each process fills the entries it owns, zeros elsewhere)."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(values)).sum(0)


def gather_rows(array: Any) -> np.ndarray:
    """A (row-sharded) global array in full on this host: read locally when this process holds all of it
    (or it is replicated), else all-gathered across processes."""
    if not isinstance(array, jax.Array) or array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
