"""Device meshes, built one way (`make_mesh`): ES's ("pop", "model") and GRPO's ("data"[, "fsdp"]); the
row shardings that split a batch over them; and multi-host start-up (`jax.distributed`)."""

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

POP, MODEL = "pop", "model"                # the ES mesh: members over "pop", tensor parallelism over "model"
DATA, FSDP = "data", "fsdp"                # the GRPO mesh: rows over both, parameters over "fsdp"
BATCH_AXES = (DATA, FSDP)                  # GRPO's mesh axes the batch is split over (those present)


def maybe_initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                                 process_id: int | None = None) -> bool:
    """Call `jax.distributed.initialize` when a multi-host run is configured (args or JAX_* env)."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator:
        return False
    if jax.distributed.is_initialized():            # already (jaxcore.trl's trainer counts the devices first)
        return True
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


def batch_axes_of(mesh: Mesh) -> tuple[str, ...]:
    """The axes of a GRPO `mesh` the batch is split over (`BATCH_AXES`, those it has)."""
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def es_mesh(model_size: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """The ES mesh: ("pop", "model"); `model` shards the compute weights, `pop` gets the other devices."""
    if model_size < 1:
        raise ValueError(f"mesh.model={model_size} must be >= 1")
    return make_mesh({POP: -1, MODEL: model_size}, devices)


def grpo_mesh(fsdp: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """The GRPO mesh: all devices on "data", times an "fsdp" axis (parameters sharded) when `fsdp > 1`."""
    if fsdp < 1:
        raise ValueError(f"grpo.fsdp={fsdp} must be >= 1")
    return make_mesh({DATA: -1, FSDP: fsdp} if fsdp > 1 else {DATA: -1}, devices)
