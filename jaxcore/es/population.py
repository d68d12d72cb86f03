"""The EGGROLL population as a transformation over the unchanged model.

A population model is the same `Transformer` whose perturbed parameters hold stand-ins instead of
arrays. The model touches weights only through array operators (``x @ kernel``, ``table[ids]``,
``x @ table.T``, ``scale * h``, ``y + bias``, ``.astype``), and the stand-ins implement exactly those:

- `LowRankPerturbed(w, a_NIR, b_NOR)` acts as ``w + a_i @ b_i.T`` for the rows of member i without
  ever forming it: ``x @ w`` stays one GEMM over every row of every member, and only the rank-r
  term ``(x @ a_i) @ b_i.T`` is per member.
- `MemberDelta(base, delta_N)` acts as ``base + delta_i`` (norm scales and biases with full noise).

Rows of every batch are grouped by member: with N members and B rows, rows [i*B/N, (i+1)*B/N)
belong to member i. Everything else (attention, the KV cache, sampling) runs on the flat batch
exactly as for plain inference, so the population costs what batched inference costs.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxcore.model.state import module_copy, variable_at
from jaxcore.model.transformer import Transformer

Array = jax.Array


_SIGNS_S = (1.0, -1.0)      # member 2p uses +noise, member 2p+1 uses -noise


def _by_pair(x: Array, pairs: int) -> Array:
    """[B, ..., I] -> [P, 2, K, I]: each antithetic pair's two members, each member's rows flattened."""
    if x.shape[0] % (2 * pairs):
        raise ValueError(f"{x.shape[0]} rows cannot be split over {2 * pairs} population members")
    return x.reshape(pairs, 2, -1, x.shape[-1])


def _signed(values_PS: Array) -> Array:
    signs_S = jnp.asarray(_SIGNS_S, values_PS.dtype)
    return values_PS * signs_S.reshape(1, 2, *([1] * (values_PS.ndim - 2)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LowRankPerturbed:
    """Stands in for ``w + sign_i * a_p @ b_p.T`` for member i of pair p = i // 2.

    w [I, O]; a [P, I, r]; b [P, O, r] with sigma / sqrt(r) folded in. Antithetic members share
    their pair's factors, so only N/2 factor sets are stored.
    """

    w: Array
    a: Array
    b: Array

    def __rmatmul__(self, x: Array) -> Array:
        y = x @ self.w
        xa_PSKR = jnp.einsum("pski,pir->pskr", _by_pair(x, self.a.shape[0]), self.a)
        delta_PSKO = jnp.einsum("pskr,por->psko", _signed(xa_PSKR), self.b)
        return y + delta_PSKO.reshape(y.shape)

    def __getitem__(self, ids: Array) -> Array:
        rows = self.w[ids]
        ids_PSK = ids.reshape(self.a.shape[0], 2, -1)
        a_PSKR = jax.vmap(lambda a_IR, ids_SK: a_IR[ids_SK])(self.a, ids_PSK)
        return rows + jnp.einsum("pskr,por->psko", _signed(a_PSKR), self.b).reshape(rows.shape)

    @property
    def T(self) -> LowRankPerturbed:  # noqa: N802 - mirrors ndarray.T
        return LowRankPerturbed(self.w.T, self.b, self.a)

    def astype(self, dtype: Any) -> LowRankPerturbed:
        return LowRankPerturbed(self.w.astype(dtype), self.a.astype(dtype), self.b.astype(dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MemberDelta:
    """Stands in for the vector ``base + sign_i * delta_p`` (delta [P, ...]) of member i of pair p."""

    base: Array
    delta: Array

    def _combine(self, other: Array, op: Callable[[Any, Any], Array], reverse: bool) -> Array:
        pairs = self.delta.shape[0]
        grouped = other.reshape(pairs, 2, -1, *other.shape[1:])
        delta_PS = _signed(jnp.broadcast_to(self.delta[:, None], (pairs, 2, *self.delta.shape[1:])))
        value = self.base + delta_PS
        value = value.reshape(pairs, 2, *([1] * (grouped.ndim - value.ndim)), *value.shape[2:])
        out = op(grouped, value) if reverse else op(value, grouped)
        return out.reshape(other.shape)

    def __mul__(self, other: Array) -> Array:
        return self._combine(other, operator.mul, reverse=False)

    def __rmul__(self, other: Array) -> Array:
        return self._combine(other, operator.mul, reverse=True)

    def __add__(self, other: Array) -> Array:
        return self._combine(other, operator.add, reverse=False)

    def __radd__(self, other: Array) -> Array:
        return self._combine(other, operator.add, reverse=True)

    def astype(self, dtype: Any) -> MemberDelta:
        return MemberDelta(self.base.astype(dtype), self.delta.astype(dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MemberNoise:
    """The population's perturbations, stored once per antithetic pair (leading axis P = N/2).

    low_rank[path] = (a_PIR, b_POR) with sigma/sqrt(r) folded into b; dense[path] = delta_P...
    (sigma folded in). Member 2p adds the pair's perturbation, member 2p+1 subtracts it.
    """

    low_rank: dict[str, tuple[Array, Array]]
    dense: dict[str, Array]

    @property
    def num_members(self) -> int:
        leaves = jax.tree.leaves(self)
        return 2 * leaves[0].shape[0] if leaves else 0

    def of_member(self, i: int) -> tuple[dict[str, tuple[Array, Array]], dict[str, Array]]:
        """Member i's own perturbation: (a_IR, sign * b_OR) per matrix, sign * delta per vector."""
        sign = _SIGNS_S[i % 2]
        return ({p: (a[i // 2], sign * b[i // 2]) for p, (a, b) in self.low_rank.items()},
                {p: sign * d[i // 2] for p, d in self.dense.items()})


def perturbed_model(base: Transformer, noise: MemberNoise) -> Transformer:
    """A copy of `base` evaluating every member of `noise` at once (rows grouped by member).

    The base parameters are shared, not copied; `base` itself is left unchanged.
    """
    model = module_copy(base)
    for path, (a_PIR, b_POR) in noise.low_rank.items():
        variable = variable_at(model, path)
        variable.set_value(LowRankPerturbed(variable.get_value(), a_PIR, b_POR))
    for path, delta_P in noise.dense.items():
        variable = variable_at(model, path)
        variable.set_value(MemberDelta(variable.get_value(), delta_P))
    return model

