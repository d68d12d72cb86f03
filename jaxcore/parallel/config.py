"""The `distributed:` and `mesh:` sections of a job config (declared once here)."""

from __future__ import annotations

import dataclasses

# Leaves with fewer elements stay replicated when masters, optimizer state or FSDP parameters are sharded
# (`mesh.shard_min_size`, `jaxcore.parallel.sharding`, the GRPO learner and the memory plans).
SHARD_MIN_SIZE = 2**14


@dataclasses.dataclass
class DistributedConfig:
    """The `distributed:` section: a multi-process run's coordinator (jax.distributed.initialize)."""

    coordinator: str | None = None      # "host:port": run jax.distributed.initialize
    num_processes: int = 1
    process_id: int = 0


@dataclasses.dataclass
class MeshConfig:
    """The `mesh:` section of an ES job: how the (pop, model) mesh splits the devices."""

    model: int = 1                      # devices that shard each compute weight; "pop" gets the rest
    device_memory: str = ""             # e.g. "40GB": checked against the memory plan (GPUs: read from the device)
    shard_min_size: int = SHARD_MIN_SIZE  # master/optimizer-state leaves with fewer elements stay replicated
