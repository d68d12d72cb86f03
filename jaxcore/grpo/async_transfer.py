"""Asynchronous GRPO across two processes (issue 53): what moves between the training process and the generating
process. The weights move device to device in one compiled program (`ProcessSync`); a generated batch and a step's
result are small and move through the host (`hand_over`, `share`).

On the CPU backend `jax.device_put` cannot move an array to another process's devices, but a program over a mesh of
both groups can: the mesh is ("group", "data") with the training devices as group 0 and the rollout devices as
group 1, each weight is laid over it as two slots along its first axis (slot 0: the trained weight on the training
devices, slot 1: a buffer of the same shape on the rollout devices), and the program sends slot 0 to slot 1 with one
`collective-permute` per weight. Both processes run it at every sync (the schedule says when), so it is counted in
the compiled program (`ProcessSync.permutes`) as well as by the run (`syncs`, `transfers`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcore.grpo.async_weights import WeightSync
from jaxcore.parallel.rows import allgather_json

GROUP, DATA = "group", "data"


def _send(tree: Any) -> Any:
    """Inside the program: every weight from group 0 to group 1 (group 0 gets zeros back, unused)."""
    return jax.tree.map(lambda x: jax.lax.ppermute(x, GROUP, [(0, 1)]), tree)


class ProcessSync:
    """`WeightSync` between processes: every sync runs one program over both groups that moves each weight once, from
    the training devices to the rollout devices. Both processes call `push` at the same syncs, the training process
    with the trained weights and the generating process with any buffers of the same shapes on its devices (its
    unused copy of the initial weights); the generating process gets the weights back, the training process None."""

    def __init__(self, train_devices: Sequence[Any], rollout_devices: Sequence[Any], rollout_mesh: Mesh):
        if len(train_devices) != len(rollout_devices):
            raise ValueError(f"grpo.asynchronous across processes moves the weights between groups of the same size: "
                             f"{len(train_devices)} training and {len(rollout_devices)} rollout devices; set "
                             "grpo.asynchronous.rollout_devices to half the devices")
        self.both = Mesh(np.array([list(train_devices), list(rollout_devices)]), (GROUP, DATA))
        self.rollout_mesh = rollout_mesh
        self.generates = any(d.process_index == jax.process_index() for d in rollout_devices)
        self._local = WeightSync(rollout_mesh)
        self._program: Any = None          # compiled at the first sync
        self._permutes = 0                 # its collective-permutes, read once from its HLO
        self.syncs = 0           # weight syncs done
        self.transfers = 0       # weights moved (each weight once per sync)
        self.seconds = 0.0       # the last sync's wall time (the copy waited for)

    def place(self, tree: Any) -> Any:
        """`tree` copied onto the rollout mesh on the generating process (its own devices); None on the training
        process, which holds no rollout copy."""
        return self._local.place(tree) if self.generates else None

    def _slots(self, x: jax.Array) -> jax.Array:
        """This process's replicated copy of a weight as its group's slot of the two-slot array over both groups (no
        copy: the same device buffers)."""
        if not x.sharding.is_fully_replicated:
            raise ValueError(f"a weight sharded as {x.sharding} cannot move between processes (only replicated ones)")
        shards = [s.data if x.ndim else s.data.reshape(1) for s in x.addressable_shards]
        shape = (2 * shards[0].shape[0], *shards[0].shape[1:])
        return jax.make_array_from_single_device_arrays(shape, NamedSharding(self.both, P(GROUP)), shards)

    def _received(self, y: jax.Array, like: jax.Array) -> jax.Array:
        """The rollout slot of the program's output, as a weight replicated over the rollout mesh."""
        shards = [s.data.reshape(like.shape) for s in y.addressable_shards]
        return jax.make_array_from_single_device_arrays(like.shape, NamedSharding(self.rollout_mesh, P()), shards)

    def push(self, params: Any) -> Any:
        """One sync (a collective: both processes call it): every weight moved once, waited for, counted. The
        generating process gets the weights on its rollout mesh; the training process None."""
        began = time.perf_counter()
        slots = jax.tree.map(self._slots, params)
        self._compile(slots)
        moved = jax.block_until_ready(self._program(slots))
        out = jax.tree.map(self._received, moved, params) if self.generates else None
        self.seconds = time.perf_counter() - began
        self.syncs += 1
        self.transfers += len(jax.tree.leaves(params))
        return out

    def close(self) -> None:
        """Nothing runs apart: every sync is waited for where it is called."""

    def prepare(self, params: Any) -> None:
        """Compile the sync program for weights shaped as `params` before the first sync (a resumed run: its
        collective-permutes are counted from the first step, as in the straight run)."""
        self._compile(jax.tree.map(self._slots, params))

    def _compile(self, slots: Any) -> None:
        if self._program is None:
            self._program = jax.jit(jax.shard_map(_send, mesh=self.both, in_specs=(P(GROUP),), out_specs=P(GROUP))
                                    ).lower(slots).compile()
            self._permutes = len(re.findall(r"\bcollective-permute(?:-start)?\(", self._program.as_text()))

    def permutes(self) -> int:
        """The collective-permutes in the compiled sync program (one per weight; 0 before the first sync)."""
        return self._permutes


def hand_over(arrays: Any | None, like: Any) -> Any:
    """Host arrays (a tree) from the one process that has them (`arrays`) to every process (a collective); the
    others give None and `like`, a tree of the same structure whose leaves have each array's shape and dtype."""
    from jax.experimental import multihost_utils

    local = arrays if arrays is not None else jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), like)
    return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(local, is_source=arrays is not None))


def share(value: Any, source: int) -> Any:
    """Process `source`'s `value` (JSON) on every process (a collective)."""
    return allgather_json(value)[source]
