"""Rows of a batch sharded over processes: the rows this process holds, a host array summed over processes,
a row-sharded array gathered in full, and small host values (JSON) gathered from every process."""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np


def local_rows(array: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, host values) of the rows of a row-sharded global array this process holds."""
    shards = sorted({s.index[0].start or 0: s for s in array.addressable_shards}.items())
    if not shards:           # a process holding none of the rows (asynchronous GRPO's generating process)
        return np.zeros(0, np.int64), np.zeros((0, *array.shape[1:]), array.dtype)
    rows = np.concatenate([np.arange(start, start + s.data.shape[0]) for start, s in shards])
    return rows, np.concatenate([np.asarray(s.data) for _, s in shards])


def owned_rows(array: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """`local_rows` restricted to the rows this process owns: a row that several processes hold (replicated
    over a mesh axis that spans processes, such as ES's "model" axis larger than one host) is owned by the
    lowest process index holding it, so that summing per-row values over processes counts each row once."""
    owner: dict[int, int] = {}
    for device, index in array.sharding.devices_indices_map(array.shape).items():
        start = index[0].start or 0
        owner[start] = min(owner.get(start, device.process_index), device.process_index)
    rows, values = local_rows(array)
    starts = {s.index[0].start or 0: s.data.shape[0] for s in array.addressable_shards}
    keep = np.zeros(len(rows), bool)
    offset = 0
    for start in sorted(starts):
        keep[offset:offset + starts[start]] = owner[start] == jax.process_index()
        offset += starts[start]
    return rows[keep], values[keep]


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


def allgather_json(value: Any) -> list[Any]:
    """Every process's `value` (JSON: a value JSON cannot hold comes back as its text), in process order."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value, default=str).encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int64))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:len(data)] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(gathered, lengths)]
