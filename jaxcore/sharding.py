"""Device meshes and shardings (jax.sharding.Mesh + NamedSharding; no pmap), and multi-host init."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

log = logging.getLogger(__name__)


def maybe_initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                                 process_id: int | None = None) -> bool:
    """Call `jax.distributed.initialize` when a multi-host run is configured (args or JAX_* env)."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator:
        return False
    num_processes = num_processes if num_processes is not None else int(os.environ["JAX_NUM_PROCESSES"])
    process_id = process_id if process_id is not None else int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    log.info("jax.distributed: process %d/%d, %d global devices", process_id, num_processes,
             jax.device_count())
    return True


def make_mesh(axis_sizes: dict[str, int] | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh over all (global) devices. One size may be -1 (the rest); default {"data": -1}."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = dict(axis_sizes or {"data": -1})
    known = math.prod(v for v in sizes.values() if v != -1)
    for name, size in sizes.items():
        if size == -1:
            sizes[name] = len(devices) // known
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh axes {sizes} do not multiply to the {len(devices)} available devices")
    return Mesh(np.asarray(devices).reshape(tuple(sizes.values())), tuple(sizes))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def leading_axis(mesh: Mesh, axis: str | tuple[str, ...]) -> NamedSharding:
    """Shard the first dimension over `axis` (population or batch), replicate the rest."""
    return NamedSharding(mesh, P(axis))


def fsdp_spec(shape: tuple[int, ...], axis: str, axis_size: int, min_size: int = 2**14) -> P:
    """Shard the largest dimension divisible by the axis size; small arrays stay replicated."""
    if math.prod(shape) < min_size or axis_size == 1:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % axis_size == 0:
            spec: list[str | None] = [None] * len(shape)
            spec[dim] = axis
            return P(*spec)
    return P()


def fsdp_shardings(tree: Any, mesh: Mesh, axis: str, min_size: int = 2**14) -> Any:
    """NamedShardings that FSDP-shard every large leaf of `tree` over `axis`."""
    size = mesh.shape[axis]
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(x.shape), axis, size, min_size)), tree)


def put_global(array: np.ndarray | jax.Array, sharding: NamedSharding) -> jax.Array:
    """Place a host array that every process holds in full as a global sharded array."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def replicate_tree(tree: Any, mesh: Mesh) -> Any:
    """Every array of `tree` replicated over `mesh` (host copies placed per device: multi-process safe)."""
    sharding = replicated(mesh)
    return jax.tree.map(lambda x: put_global(np.asarray(x), sharding), tree)


def replicate_model(model: Any, mesh: Mesh) -> Any:
    """Place every parameter of an NNX model on all devices of `mesh` (replicated), in place."""
    from flax import nnx

    nnx.update(model, replicate_tree(nnx.state(model), mesh))
    return model
