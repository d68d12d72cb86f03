"""The EGGROLL population as a transformation over the unchanged model.

A member's weights are never materialised: each perturbed matrix is replaced by a
`LowRankPerturbed(w, a, b)` stand-in that behaves like ``w + a @ b.T`` under the only operators the
model uses (``x @ kernel``, ``table[ids]``, ``x @ table.T``, ``.astype``). `PopulationModel` vmaps
the model over members with the base weights broadcast, so ``x @ w`` stays one large matmul over
the whole population and only the rank-r term ``(x @ a) @ b.T`` is per member.

Rows of every batch are grouped by member: rows [i*M, (i+1)*M) belong to member i.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcore.model import KVCache, Transformer

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LowRankPerturbed:
    """Stands in for the matrix ``w + a @ b.T`` (w [I, O], a [I, r], b [O, r]) without forming it."""

    w: Array
    a: Array
    b: Array

    def __rmatmul__(self, x: Array) -> Array:
        return x @ self.w + (x @ self.a) @ self.b.T

    def __getitem__(self, ids: Array) -> Array:
        return self.w[ids] + self.a[ids] @ self.b.T

    @property
    def T(self) -> LowRankPerturbed:  # noqa: N802 - mirrors ndarray.T
        return LowRankPerturbed(self.w.T, self.b, self.a)

    def astype(self, dtype: Any) -> LowRankPerturbed:
        return LowRankPerturbed(self.w.astype(dtype), self.a.astype(dtype), self.b.astype(dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MemberNoise:
    """Per-member perturbations, every leaf with a leading member axis N.

    low_rank[path] = (a_NIR, b_NOR) with sign and sigma/sqrt(r) folded into b;
    dense[path] = delta_N... added to a non-matrix parameter (norm scale, bias).
    """

    low_rank: dict[str, tuple[Array, Array]]
    dense: dict[str, Array]

    @property
    def num_members(self) -> int:
        leaves = jax.tree.leaves(self)
        return leaves[0].shape[0] if leaves else 0


def variable_at(model: nnx.Module, path: str) -> nnx.Variable:
    node: Any = model
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def perturb_in_place(model: Transformer, noise: MemberNoise) -> Transformer:
    """Swap one member's perturbed weights into a (freshly merged, traced) model."""
    for path, (a_IR, b_OR) in noise.low_rank.items():
        variable = variable_at(model, path)
        variable.set_value(LowRankPerturbed(variable.get_value(), a_IR, b_OR))
    for path, delta in noise.dense.items():
        variable = variable_at(model, path)
        variable.set_value(variable.get_value() + delta.astype(variable.get_value().dtype))
    return model


def _split_members(x: Array, members: int) -> Array:
    return x.reshape(members, x.shape[0] // members, *x.shape[1:])


def _join_members(x: Array) -> Array:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


class PopulationModel(nnx.Module):
    """`base` evaluated for every member of `noise` at once; same call signature as the model."""

    def __init__(self, base: Transformer, noise: MemberNoise):
        self.base = base
        self.noise = nnx.Variable(noise)

    @property
    def config(self) -> Any:
        return self.base.config

    @property
    def dtype(self) -> Any:
        return self.base.dtype

    @property
    def num_members(self) -> int:
        return self.noise.get_value().num_members

    def _member_fn(self, method: str):
        graphdef, state = nnx.split(self.base)

        def run(noise_i: MemberNoise, *args: Any, **kwargs: Any) -> Any:
            fresh = jax.tree.map(lambda x: x, state)    # new Variables owned by this trace; base untouched
            member = perturb_in_place(nnx.merge(graphdef, fresh), noise_i)
            return getattr(member, method)(*args, **kwargs)

        return run

    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 positions: Array | None = None) -> Array:
        """Logits [N*M, T, V] for rows grouped by member."""
        n = self.num_members
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        run = self._member_fn("__call__")
        split = (lambda x: None if x is None else _split_members(x, n))
        in_axes = (0, 0, 0, None if positions is None else 0)
        logits = jax.vmap(run, in_axes=in_axes)(self.noise.get_value(), split(input_ids), split(attention_mask),
                                                split(positions))
        return _join_members(logits)

    def forward_cached(self, input_ids_BT: Array, positions_BT: Array, valid_BT: Array, cache: KVCache,
                       cache_index: Array, *, last_only: bool = False) -> tuple[Array, KVCache]:
        """`Transformer.forward_cached` for every member; B = N * M rows grouped by member."""
        n = self.num_members
        run = self._member_fn("forward_cached")

        def member(noise_i, ids, positions, valid, cache_i):
            return run(noise_i, ids, positions, valid, cache_i, cache_index, last_only=last_only)

        split = (lambda x: _split_members(x, n))
        logits, new_cache = jax.vmap(member)(self.noise.get_value(), split(input_ids_BT), split(positions_BT),
                                             split(valid_BT), jax.tree.map(split, cache))
        return _join_members(logits), jax.tree.map(_join_members, new_cache)
