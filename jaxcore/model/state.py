"""A model's parameters by dotted path ('blocks.0.attn.q.kernel'): read them all, find one, write some back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def flat_state(model: nnx.Module) -> dict[str, Any]:
    """{'blocks.0.attn.q.kernel': value, ...} for every parameter of the model."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, path + ".")
            else:
                flat[path] = value

    walk(nnx.to_pure_dict(nnx.state(model, nnx.Param)), "")
    return flat


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
def _moments(flat: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {path: jnp.stack([jnp.abs(x.astype(jnp.float32)).sum(), jnp.square(x.astype(jnp.float32)).sum()])
            for path, x in flat.items()}


def weight_moments(model: nnx.Module) -> dict[str, list[float]]:
    """{path: [sum |w|, sum w^2]} of every parameter: a fingerprint of the weights that tells another model of
    the same shapes apart (reduced on device, wherever the parameters live; every process gets it)."""
    return {path: [float(v) for v in np.asarray(values)]
            for path, values in _moments({k: jnp.asarray(v) for k, v in flat_state(model).items()}).items()}
