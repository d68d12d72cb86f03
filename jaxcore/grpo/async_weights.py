"""Asynchronous GRPO's weight sync: the trained weights copied onto the rollout devices every `weight_sync_steps`
optimizer steps (issue 53), device to device.

Each weight is placed on the rollout group with the sharding its training copy has, laid over the rollout
devices (`rollout_sharding`), so `jax.device_put` copies device buffers to the other group and never reads an array
back to the host (a sharded-to-replicated move would: JAX gathers it through the host). A replicated weight lands
replicated; an FSDP-sharded one (`grpo.fsdp`) lands with its shards on the rollout devices in the training layout
and is then gathered there, in one compiled program for the whole tree, since decoding reads every weight whole.
Every sync moves each weight once and is counted (`syncs`, `transfers`), with its seconds. A sync runs on a thread
of its own (`start`), so the trainer goes on with its next steps while the weights move (its steps leave the params
they read intact: `GRPOLearner.keeps_params`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from jaxcore.parallel import meshes


def rollout_sharding(sharding: jax.sharding.Sharding, mesh: Mesh) -> NamedSharding:
    """`sharding` (a training weight's, on the training mesh) laid over the rollout `mesh`'s devices: replicated
    stays replicated; a sharded weight keeps its spec on the rollout devices arranged as the training mesh (each
    shard copied to its counterpart device), which needs groups of the same size (else one line: it would go
    through the host)."""
    if sharding.is_fully_replicated:
        return meshes.replicated(mesh)
    source = getattr(sharding, "mesh", None)
    if source is None or source.size != mesh.size:
        raise ValueError(f"a weight sharded as {sharding} cannot move to a rollout group of {mesh.size} devices "
                         "without a host round trip")
    same_layout = meshes.make_mesh(dict(source.shape), list(mesh.devices.flat))
    return NamedSharding(same_layout, sharding.spec)


class WeightSync:
    """Copies a tree of training weights onto the rollout mesh, counting syncs and weights moved."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.syncs = 0           # weight syncs started
        self.transfers = 0       # weights moved (each weight once per sync)
        self.seconds = 0.0       # the newest finished sync's wall time (the copy waited for)
        # gathers FSDP-sharded weights on the rollout devices: one program for the whole tree
        self._gather = jax.jit(lambda tree: tree, out_shardings=meshes.replicated(mesh))
        self._thread: ThreadPoolExecutor | None = None      # where syncs run, one at a time (made at the first)

    def place(self, tree: Any) -> Any:
        """`tree` copied onto the rollout mesh (waited for), without counting it as a sync (the frozen LoRA base,
        a restored checkpoint's weights)."""
        moved = jax.device_put(tree, jax.tree.map(lambda x: rollout_sharding(x.sharding, self.mesh), tree))
        if not all(x.sharding.is_fully_replicated for x in jax.tree.leaves(moved)):
            moved = self._gather(moved)
        return jax.block_until_ready(moved)

    def start(self, params: Any, then: Callable[[Any], None] | None = None) -> Future:
        """One sync, counted now and run on the sync thread (after the syncs started before it): every weight of
        `params` copied onto the rollout mesh, then `then(copy)` there. `params` must stay intact until it is done
        (no step may donate them); the future gives the copy."""
        self.syncs += 1
        self.transfers += len(jax.tree.leaves(params))
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxcore-weight-sync")
        return self._thread.submit(self._copy, params, then)

    def close(self) -> None:
        """Wait for the syncs started, then let the sync thread go."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _copy(self, params: Any, then: Callable[[Any], None] | None) -> Any:
        began = time.perf_counter()
        copied = self.place(params)
        self.seconds = time.perf_counter() - began
        if then is not None:
            then(copied)
        return copied
