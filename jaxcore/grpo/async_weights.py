"""Asynchronous GRPO's weight sync: the trained weights copied onto the rollout devices every `weight_sync_steps`
optimizer steps (issue 53), device to device.

Each weight is placed on the rollout group with the sharding its training copy has, laid over the rollout
devices (`rollout_sharding`): replicated stays replicated, so `jax.device_put` copies device buffers to the other
group and never reads an array back to the host (a sharded-to-replicated move would: JAX gathers it through the
host). Every sync moves each weight once and is counted (`syncs`, `transfers`), with its seconds.
"""

from __future__ import annotations

import time
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding


def rollout_sharding(sharding: jax.sharding.Sharding, mesh: Mesh) -> NamedSharding:
    """`sharding` (a training weight's, on the training mesh) laid over the rollout `mesh`: the same spec where the
    meshes have the same shape, else replicated (only a replicated weight may move between groups of different
    sizes without a host round trip; the caller refuses sharded weights there)."""
    spec = getattr(sharding, "spec", None)
    same_shape = getattr(sharding, "mesh", None) is not None and dict(sharding.mesh.shape) == dict(mesh.shape)
    if spec is not None and same_shape:
        return NamedSharding(mesh, spec)
    if not sharding.is_fully_replicated:
        raise ValueError(f"a weight sharded as {sharding} cannot move to a rollout group of {mesh.size} devices "
                         "without a host round trip")
    return NamedSharding(mesh, jax.sharding.PartitionSpec())


class WeightSync:
    """Copies a tree of training weights onto the rollout mesh, counting syncs and weights moved."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.syncs = 0           # weight syncs done
        self.transfers = 0       # weights moved (each weight once per sync)
        self.seconds = 0.0       # the last sync's wall time (the copy waited for)

    def place(self, tree: Any) -> Any:
        """`tree` copied onto the rollout mesh (waited for), without counting it as a sync (the frozen LoRA base,
        a restored checkpoint's weights)."""
        shardings = jax.tree.map(lambda x: rollout_sharding(x.sharding, self.mesh), tree)
        return jax.block_until_ready(jax.device_put(tree, shardings))

    def push(self, params: Any) -> Any:
        """One sync: every weight of `params` copied onto the rollout mesh, waited for (the next optimizer step
        donates the training copy), counted."""
        began = time.perf_counter()
        copied = self.place(params)
        self.seconds = time.perf_counter() - began
        self.syncs += 1
        self.transfers += len(jax.tree.leaves(params))
        return copied
