"""The `distributed:` and `mesh:` sections of a job config (declared once here)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge

from jaxcore.config.schema import Checked

# Leaves with fewer elements stay replicated when masters, optimizer state or FSDP parameters are sharded
# (`mesh.shard_min_size`, `jaxcore.parallel.sharding`, the GRPO learner and the memory plans).
SHARD_MIN_SIZE = 2**14


@dataclasses.dataclass
class DistributedConfig(Checked):
    """The `distributed:` section: a multi-process run's coordinator (jax.distributed.initialize)."""

    coordinator: str | None = None      # "host:port": run jax.distributed.initialize
    num_processes: Annotated[int, Ge(1)] = 1
    process_id: Annotated[int, Ge(0)] = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.process_id >= self.num_processes:
            raise ValueError(f"process_id={self.process_id} must be < num_processes={self.num_processes}")


@dataclasses.dataclass
class MeshConfig(Checked):
    """The `mesh:` section of an ES job: how the (pop, model) mesh splits the devices."""

    model: Annotated[int, Ge(1)] = 1    # devices that shard each compute weight; "pop" gets the rest
    device_memory: str = ""             # e.g. "40GB": checked against the memory plan (GPUs: read from the device)
    shard_min_size: Annotated[int, Ge(1)] = SHARD_MIN_SIZE  # master/optimizer-state leaves smaller stay replicated
