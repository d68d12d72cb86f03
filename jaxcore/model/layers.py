"""The transformer's building blocks, each touching its weights only through array operators (`x @ kernel`,
`table[ids]`, `.astype`): the linear layer, the norms, the feed-forward and the embedding table (`transformer`
assembles them; `jaxcore.es` swaps their weights for stand-ins).

Shape suffixes: B batch, T length, D model width, F MLP width, N/I/O rows, inputs, outputs.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcore.model.axes import EMBED, FFN
from jaxcore.model.config import ModelConfig

Array = jax.Array


def matmul_rows(x_NI: Array, w_IO: Any) -> Array:
    """``x @ w`` with every leading axis of x flattened into one row axis.

    XLA:CPU lays a [B, T, I] operand's weight-gradient contraction out as a transposing loop fusion over
    all three axes (half of a GRPO step's MLP time on two cores); over [B*T, I] rows it is one 2-D GEMM.
    """
    rows_RI = x_NI.reshape(-1, x_NI.shape[-1])
    return (rows_RI @ w_IO).reshape(*x_NI.shape[:-1], -1)


def _normal(rngs: nnx.Rngs | None, shape: tuple[int, ...], dtype: Any) -> Array:
    """The random init N(0, 0.02^2); zeros without `rngs` (a model built only for its shapes skips tracing the
    random draws: `abstract_model`)."""
    return jnp.zeros(shape, dtype) if rngs is None else jax.random.normal(rngs.params(), shape, dtype) * 0.02


def _param(value: Array) -> nnx.Param:
    return nnx.Param(value)


def _value(variable: nnx.Variable | None) -> Any:
    return None if variable is None else variable.get_value()


class Linear(nnx.Module):
    """y = x @ kernel (+ bias); kernel stored [in, out] in the parameter dtype; `axes`: the logical axes of its
    input and output (`jaxcore.model.axes`)."""

    def __init__(self, d_in: int, d_out: int, bias: bool, *, axes: tuple[str, str], rngs: nnx.Rngs | None,
                 param_dtype: Any):
        self.axes = axes
        self.kernel = _param(_normal(rngs, (d_in, d_out), param_dtype))
        self.bias = _param(jnp.zeros((d_out,), param_dtype)) if bias else None

    def param_axes(self) -> dict[str, tuple[str, ...]]:
        return {"kernel": self.axes, **({"bias": self.axes[1:]} if self.bias is not None else {})}

    def __call__(self, x: Array) -> Array:
        y = matmul_rows(x, _value(self.kernel).astype(x.dtype))
        if self.bias is not None:
            y = y + _value(self.bias).astype(x.dtype)
        return y


class Norm(nnx.Module):
    """RMSNorm (Llama/Qwen: scale * x; Gemma, kind "rms_offset": (1 + scale) * x, all in float32) or LayerNorm
    (GPT-2), normalising in float32."""

    def __init__(self, dim: int, kind: str, eps: float, *, param_dtype: Any, axis: str = EMBED):
        self.kind, self.eps, self.axis = kind, eps, axis
        self.scale = _param(jnp.ones((dim,), param_dtype))
        self.bias = _param(jnp.zeros((dim,), param_dtype)) if kind == "layer" else None

    def param_axes(self) -> dict[str, tuple[str, ...]]:
        return {"scale": (self.axis,), **({"bias": (self.axis,)} if self.bias is not None else {})}

    def __call__(self, x: Array) -> Array:
        f32 = jnp.promote_types(x.dtype, jnp.float32)      # float32 (float64 stays float64)
        h = x.astype(f32)
        if self.kind == "layer":
            h = h - h.mean(-1, keepdims=True)
            h = h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + self.eps)
            h = h * _value(self.scale).astype(f32) + _value(self.bias).astype(f32)
            return h.astype(x.dtype)
        h = h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + self.eps)
        if self.kind == "rms_offset":     # h * (1 + scale), written so that a population stand-in can be the scale
            return (h + _value(self.scale).astype(f32) * h).astype(x.dtype)
        return _value(self.scale).astype(x.dtype) * h.astype(x.dtype)


def _activation(name: str, x: Array) -> Array:
    if name == "silu":
        return jax.nn.silu(x)
    return jax.nn.gelu(x, approximate=name == "gelu_tanh")


class MLP(nnx.Module):
    """Gated (SwiGLU: down(silu(gate x) * up x)) or plain (down(gelu(up x))) feed-forward."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None, param_dtype: Any):
        d, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.activation = config.activation
        linear = functools.partial(Linear, rngs=rngs, param_dtype=param_dtype)
        self.gate = linear(d, f, bias, axes=(EMBED, FFN)) if config.gated_mlp else None
        self.up = linear(d, f, bias, axes=(EMBED, FFN))
        self.down = linear(f, d, bias, axes=(FFN, EMBED))

    def __call__(self, x_BTD: Array) -> Array:
        h_BTF = self.up(x_BTD)
        if self.gate is not None:
            h_BTF = _activation(self.activation, self.gate(x_BTD)) * h_BTF
        else:
            h_BTF = _activation(self.activation, h_BTF)
        return self.down(h_BTF)


class Embedding(nnx.Module):
    """Token (or position) table [V, D]; `attend` is the tied LM head."""

    def __init__(self, num: int, dim: int, *, axes: tuple[str, str], rngs: nnx.Rngs | None, param_dtype: Any):
        self.axes = axes
        self.table = _param(_normal(rngs, (num, dim), param_dtype))

    def param_axes(self) -> dict[str, tuple[str, ...]]:
        return {"table": self.axes}

    def __call__(self, ids: Array, dtype: Any) -> Array:
        return _value(self.table)[ids].astype(dtype)

    def attend(self, x_BTD: Array) -> Array:
        return matmul_rows(x_BTD, _value(self.table).T.astype(x_BTD.dtype))
