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
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

import jax
import jax.numpy as jnp
from annotated_types import Ge, Interval, MinLen
from flax import nnx

from jaxcore.config.schema import Checked
from jaxcore.model import layer_stack
from jaxcore.model.state import flat_state, module_copy, variable_at
from jaxcore.model.transformer import Transformer

Array = jax.Array
Adapters = dict[str, dict[str, Array]]          # kernel path -> {"a": [I, r], "b": [r, O]}
Scalings = Mapping[str, float]                  # kernel path -> alpha / rank of its adapter (peft's `scaling`)
ALL_LINEAR = "all-linear"                       # peft's shorthand: every linear layer except lm_head
LoRAExport = Literal["merged", "adapter", "both"]
LORA_EXPORTS = typing.get_args(LoRAExport)


@dataclasses.dataclass
class LoRAConfig(Checked):
    """peft's LoraConfig (r, lora_alpha, target_modules, exclude_modules, lora_dropout, rank_pattern,
    alpha_pattern), plus the frozen base's dtype and what a training run exports; a job's `grpo.lora` section.
    Modules are named as in the HF model (`model.layers.0.self_attn.q_proj`) and matched by peft's rules
    (`jaxcore.hf.peft.target_paths`): a list entry names a module or the end of its name, a string is a regular
    expression over the whole name ("all-linear": every linear layer but the LM head)."""

    rank: Annotated[int, Ge(1)] = 8
    alpha: float = 8.0
    target_modules: Annotated[Sequence[str], MinLen(1)] | str = dataclasses.field(
        default_factory=lambda: ["q_proj", "v_proj"])
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.0
    base_dtype: Literal["float32", "bfloat16", "float16"] | None = None   # e.g. bfloat16: store the frozen base in bf16
    export: LoRAExport = "both"         # merged (train.export_hf's final_hf) | adapter (final_adapter) | both
    rank_pattern: dict[str, Annotated[int, Ge(1)]] = dataclasses.field(default_factory=dict)  # name regex -> rank
    alpha_pattern: dict[str, float] = dataclasses.field(default_factory=dict)                 # name regex -> alpha
    exclude_modules: Sequence[str] | str | None = None      # modules left out, matched as target_modules are

    @property
    def scaling(self) -> float:
        """alpha / rank of a module no pattern names."""
        return self.alpha / self.rank

    def rank_of(self, module: str) -> int:
        """The adapter rank of the HF module `module` (rank_pattern's first match, else rank)."""
        return self.rank_pattern.get(pattern_key(self.rank_pattern, module), self.rank)

    def scaling_of(self, module: str) -> float:
        """alpha / rank of the HF module `module`, each from its pattern as peft reads them."""
        return self.alpha_pattern.get(pattern_key(self.alpha_pattern, module), self.alpha) / self.rank_of(module)


def pattern_key(patterns: Iterable[str], module: str) -> str:
    """The first of `patterns` that matches the end of `module` at a name boundary, else `module` itself (peft's
    `get_pattern_key`: rank_pattern and alpha_pattern keys are regular expressions)."""
    return next((key for key in patterns if re.match(rf"(.*\.)?({key})$", module)), module)


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


def init_adapters(model: Transformer, paths: Iterable[str], cfg: LoRAConfig, key: Array,
                  ranks: Mapping[str, int] | None = None) -> Adapters:
    """Adapters on the kernels at `paths` (`jaxcore.hf.peft.target_paths` picks them by HF module name), of rank
    `ranks[path]` (default `cfg.rank`), with peft's init: a ~ kaiming_uniform(sqrt 5) = U(-1/sqrt(I), 1/sqrt(I)),
    b = 0 (so the model is unchanged)."""
    adapters: Adapters = {}
    for i, path in enumerate(sorted(paths)):
        d_in, d_out = variable_at(model, path).get_value().shape
        rank = (ranks or {}).get(path, cfg.rank)
        bound = 1.0 / math.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (d_in, rank), jnp.float32, -bound, bound)
        adapters[path] = {"a": a, "b": jnp.zeros((rank, d_out), jnp.float32)}
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


def stacked_scalings(scalings: Scalings, num_layers: int) -> dict[str, float]:
    """Per-layer `scalings` in the stacked layout (`layer_stack.stack_paths`); a ValueError when the layers of one
    kind of kernel differ (alpha_pattern naming single layers): such adapters train per layer."""
    paths = list(scalings)
    out = {}
    for path, index in layer_stack.stack_paths({p: i for i, p in enumerate(paths)}, num_layers).items():
        distinct = {scalings[paths[i]] for i in jnp.ravel(jnp.asarray(index)).tolist()}
        if len(distinct) != 1:
            raise ValueError(f"{path} has a different LoRA scaling on some layers: it cannot be stacked")
        out[path] = distinct.pop()
    return out


def lora_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, key: Array | None = None,
               scalings: Scalings | None = None) -> Transformer:
    """A copy of `base` whose targeted kernels apply their adapters (dropout only when `key` is given), in either
    layout of the blocks (`jaxcore.model.layer_stack`: stacked adapters on a scanned base), each scaled by
    `scalings[path]` (default: `cfg.scaling`).

    The base parameters are shared, not copied; `base` itself is left unchanged.
    """
    model = module_copy(base)
    keys = dropout_keys(adapters, key) if key is not None else {}
    for path, ab in sorted(adapters.items()):
        variable = variable_at(model, path)
        variable.set_value(LoRAKernel(variable.get_value(), ab["a"], ab["b"], keys.get(path),
                                      _scaling(cfg, scalings, path), cfg.dropout))
    return model


def merged_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, dtype: Any = jnp.float32,
                 scalings: Scalings | None = None) -> Transformer:
    """`base` with ``w + scaling * a @ b`` in `dtype` in every targeted kernel (peft's `merge_and_unload`)."""
    model = module_copy(base)
    for path, ab in adapters.items():
        variable = variable_at(model, path)
        w = variable.get_value().astype(jnp.float32)
        delta = _scaling(cfg, scalings, path) * (ab["a"].astype(jnp.float32) @ ab["b"].astype(jnp.float32))
        variable.set_value((w + delta).astype(dtype))
    return model


def split_adapters(model: Transformer) -> tuple[Transformer, Adapters, dict[str, float]]:
    """`lora_model`'s inverse: the base (a copy sharing the arrays), and the adapters and scalings its stand-ins
    hold (none for a plain model), e.g. to continue training a peft model's adapter."""
    base, adapters, scalings = module_copy(model), {}, {}
    for path, value in flat_state(model).items():
        if isinstance(value, LoRAKernel):
            variable_at(base, path).set_value(value.w)
            adapters[path], scalings[path] = {"a": value.a, "b": value.b}, value.scaling
    return base, adapters, scalings


def _scaling(cfg: LoRAConfig, scalings: Scalings | None, path: str) -> float:
    return cfg.scaling if scalings is None else scalings[path]
