"""LoRA as a transformation over the unchanged model (peft's formulas and file layout).

A LoRA model is the same `Transformer` whose targeted kernels hold `LoRAKernel` stand-ins: the model
only does ``x @ kernel.astype(dtype)`` with them, and the stand-in computes
``x @ w + dropout(x) @ a @ b * alpha / rank`` (peft's ``base(x) + lora_B(lora_A(dropout(x))) * scaling``)
without forming ``w + a @ b``. The base stays frozen (and may be stored in bf16); only the adapters
``{kernel path: {"a": [I, r], "b": [r, O]}}`` are trained. Adapters off is the base model itself,
which is why GRPO's reference model costs no second copy.

Exports: `merged_model` (``w + scaling * a @ b``, peft's `merge_and_unload`) for `save_hf`; the peft
adapter directory and the choice of targets by HF module name (q_proj, ..., down_proj) are
`jaxcore.hf.peft`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import jax
import jax.numpy as jnp
from annotated_types import Ge, Interval, MinLen
from flax import nnx

from jaxcore.config.schema import Checked
from jaxcore.model import layer_stack
from jaxcore.model.state import module_copy, variable_at
from jaxcore.model.transformer import Transformer

Array = jax.Array
Adapters = dict[str, dict[str, Array]]          # kernel path -> {"a": [I, r], "b": [r, O]}
ALL_LINEAR = "all-linear"                       # peft's shorthand: every linear layer except lm_head
LoRAExport = Literal["merged", "adapter", "both"]
LORA_EXPORTS = typing.get_args(LoRAExport)


@dataclasses.dataclass
class LoRAConfig(Checked):
    """peft's LoraConfig (r, lora_alpha, target_modules, lora_dropout), plus the frozen base's dtype and what
    a training run exports; a job's `grpo.lora` section."""

    rank: Annotated[int, Ge(1)] = 8
    alpha: float = 8.0
    target_modules: Annotated[Sequence[str], MinLen(1)] = dataclasses.field(
        default_factory=lambda: ["q_proj", "v_proj"])
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.0
    base_dtype: Literal["float32", "bfloat16", "float16"] | None = None   # e.g. bfloat16: store the frozen base in bf16
    export: LoRAExport = "both"         # merged (train.export_hf's final_hf) | adapter (final_adapter) | both

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LoRAKernel:
    """Stands in for ``w + scaling * a @ b`` (w [I, O], a [I, r], b [r, O]); dropout on the LoRA input."""

    w: Array
    a: Array
    b: Array
    key: Array | None = None
    scaling: float = dataclasses.field(default=1.0, metadata={"static": True})
    dropout: float = dataclasses.field(default=0.0, metadata={"static": True})

    def __rmatmul__(self, x: Array) -> Array:
        y = x @ self.w
        if self.key is not None and self.dropout > 0.0:
            keep = jax.random.bernoulli(self.key, 1.0 - self.dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - self.dropout), 0.0).astype(x.dtype)
        return y + ((x @ self.a) @ self.b) * jnp.asarray(self.scaling, y.dtype)

    def astype(self, dtype: Any) -> LoRAKernel:
        return dataclasses.replace(self, w=self.w.astype(dtype), a=self.a.astype(dtype), b=self.b.astype(dtype))


def init_adapters(model: Transformer, paths: Iterable[str], cfg: LoRAConfig, key: Array) -> Adapters:
    """Adapters on the kernels at `paths` (`jaxcore.hf.peft.target_paths` picks them by HF module name), with
    peft's init: a ~ kaiming_uniform(sqrt 5) = U(-1/sqrt(I), 1/sqrt(I)), b = 0 (so the model is unchanged)."""
    adapters: Adapters = {}
    for i, path in enumerate(sorted(paths)):
        d_in, d_out = variable_at(model, path).get_value().shape
        bound = 1.0 / math.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (d_in, cfg.rank), jnp.float32, -bound, bound)
        adapters[path] = {"a": a, "b": jnp.zeros((cfg.rank, d_out), jnp.float32)}
    return adapters


def frozen_base(model: Transformer, cfg: LoRAConfig) -> Transformer:
    """`model` with its parameters cast to `cfg.base_dtype` (a view sharing the arrays when None)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if cfg.base_dtype is not None:
        params = jax.tree.map(lambda x: x.astype(cfg.base_dtype), params)
    return nnx.merge(graphdef, params, rest)


def dropout_keys(adapters: Adapters, key: Array) -> dict[str, Array]:
    """Each adapter's dropout key: `fold_in(key, i)` for the i-th kernel path in sorted per-layer order, in either
    layout (a stacked `blocks.body.…` adapter gets the keys of its layers, stacked), so that a scanned model drops
    the same entries as the per-layer one."""
    per_layer = layer_stack.unstack_paths(adapters, _num_layers(adapters))
    index = {path: i for i, path in enumerate(sorted(per_layer))}
    keys = layer_stack.stack_paths({path: jax.random.fold_in(key, index[path]) for path in per_layer},
                                   _num_layers(adapters)) if _num_layers(adapters) else {}
    return {path: keys[path] if path in keys else jax.random.fold_in(key, index[path]) for path in adapters}


def _num_layers(adapters: Adapters) -> int:
    """The layer count of stacked adapters (0 when none is stacked: per-layer paths need none)."""
    for path, ab in adapters.items():
        if layer_stack.is_stacked_path(path):
            return ab["a"].shape[0] + 1
    return 0


def lora_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, key: Array | None = None) -> Transformer:
    """A copy of `base` whose targeted kernels apply their adapters (dropout only when `key` is given), in either
    layout of the blocks (`jaxcore.model.layer_stack`: stacked adapters on a scanned base).

    The base parameters are shared, not copied; `base` itself is left unchanged.
    """
    model = module_copy(base)
    keys = dropout_keys(adapters, key) if key is not None else {}
    for path, ab in sorted(adapters.items()):
        variable = variable_at(model, path)
        variable.set_value(LoRAKernel(variable.get_value(), ab["a"], ab["b"], keys.get(path), cfg.scaling,
                                      cfg.dropout))
    return model


def merged_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, dtype: Any = jnp.float32) -> Transformer:
    """`base` with ``w + scaling * a @ b`` in `dtype` in every targeted kernel (peft's `merge_and_unload`)."""
    model = module_copy(base)
    for path, ab in adapters.items():
        variable = variable_at(model, path)
        w = variable.get_value().astype(jnp.float32)
        variable.set_value((w + cfg.scaling * (ab["a"].astype(jnp.float32) @ ab["b"].astype(jnp.float32)))
                           .astype(dtype))
    return model
