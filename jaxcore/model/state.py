"""A model's parameters by dotted path ('blocks.0.attn.q.kernel'): read them all, find one, write some back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def _is_variable(node: Any) -> bool:
    return isinstance(node, nnx.Variable)


def flat_state(model: nnx.Module) -> dict[str, Any]:
    """{'blocks.0.attn.q.kernel': value, ...} for every parameter of the model, in `nnx.state`'s order.

    Read through the module's pytree structure (flax's `nnx.Module` is a pytree) rather than `nnx.state`'s graph
    traversal: the same entries in the same order, several times faster, and the ES and GRPO loops read their
    parameters several times per step."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=_is_variable)
    return {jax.tree_util.keystr(path, simple=True, separator="."): variable.get_value()
            for path, variable in leaves if isinstance(variable, nnx.Param)}


def module_copy(model: nnx.Module) -> Any:
    """The same module with fresh Variables over the same values: setting a value on the copy (a stand-in, a
    resharded array) leaves `model` unchanged. What ``nnx.merge(graphdef, jax.tree.map(lambda x: x, state))``
    makes, through the pytree structure (faster than the graph traversal)."""
    return jax.tree.map(lambda x: x, model)


def variable_at(model: nnx.Module, path: str) -> nnx.Variable:
    """The variable at a dotted parameter path such as 'blocks.0.attn.q.kernel'."""
    node: Any = model
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def write_params(model: nnx.Module, params: Mapping[str, Any]) -> None:
    """Store `{path: value}` into the model's variables, in place."""
    for path, value in params.items():
        variable_at(model, path).set_value(value)


@jax.jit
def _moments(x: jax.Array) -> jax.Array:
    return jnp.stack([jnp.abs(x.astype(jnp.float32)).sum(), jnp.square(x.astype(jnp.float32)).sum()])


def _arrays(model: nnx.Module) -> dict[str, Any]:
    """`flat_state`'s arrays; those of a stand-in each under '<path>.<field>'."""
    out = {}
    for path, value in flat_state(model).items():
        for at, leaf in jax.tree_util.tree_leaves_with_path(value):
            field = jax.tree_util.keystr(at, simple=True, separator=".")
            out[f"{path}.{field}" if field else path] = leaf
    return out


def weight_moments(model: nnx.Module) -> dict[str, list[float]]:
    """{path: [sum |w|, sum w^2]} of every parameter: a fingerprint of the weights that tells another model of
    the same shapes apart (reduced on device, wherever the parameters live; every process gets it). One small
    program per parameter shape, not one program over all of them (which took a second to make at 135M). A
    parameter holding a stand-in (LoRA's w, a and b) gives one entry per array it holds ('<path>.a', ...)."""
    moments = {k: _moments(jnp.asarray(v)) for k, v in _arrays(model).items()}
    return {path: [float(v) for v in values] for path, values in jax.device_get(moments).items()}
