"""LoRA as a transformation over the unchanged model (peft's formulas and file layout).

A LoRA model is the same `Transformer` whose targeted kernels hold `LoRAKernel` stand-ins: the model
only does ``x @ kernel.astype(dtype)`` with them, and the stand-in computes
``x @ w + dropout(x) @ a @ b * alpha / rank`` (peft's ``base(x) + lora_B(lora_A(dropout(x))) * scaling``)
without forming ``w + a @ b``. The base stays frozen (and may be stored in bf16); only the adapters
``{kernel path: {"a": [I, r], "b": [r, O]}}`` are trained. Adapters off is the base model itself,
which is why GRPO's reference model costs no second copy.

Exports: `merged_model` (``w + scaling * a @ b``, peft's `merge_and_unload`) for `save_hf`, and
`save_adapter`, a directory `peft.PeftModel.from_pretrained` loads (adapter_config.json +
adapter_model.safetensors with peft's key names). Targets use HF module names (q_proj, ..., down_proj).
GPT-2 (fused c_attn Conv1D) is not supported.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxcore.es.population import variable_at
from jaxcore.hf.convert import atomic_directory
from jaxcore.hf.mapping import tensor_maps
from jaxcore.model.transformer import Transformer

Array = jax.Array
Adapters = dict[str, dict[str, Array]]          # kernel path -> {"a": [I, r], "b": [r, O]}
ALL_LINEAR = "all-linear"                       # peft's shorthand: every linear layer except lm_head


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """peft's LoraConfig names and defaults (r, lora_alpha, target_modules, lora_dropout)."""

    rank: int = 8
    alpha: float = 8.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    dropout: float = 0.0
    base_dtype: str | None = None        # e.g. "bfloat16": store the frozen base in this dtype

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, not {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("lora.dropout must be in [0, 1)")
        if not self.target_modules:
            raise ValueError("lora.target_modules is empty")

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


def hf_modules(model: Transformer) -> dict[str, str]:
    """jaxcore kernel path -> HF module name (e.g. 'blocks.0.attn.q.kernel' -> 'model.layers.0.self_attn.q_proj')."""
    if model.config.is_gpt2:
        raise ValueError("LoRA is not supported for GPT-2 (fused c_attn); use a Llama/Qwen-style model")
    return {m.jax_paths[0]: m.hf_key.removesuffix(".weight") for m in tensor_maps(model.config)
            if m.kind == "transpose"}


def target_paths(model: Transformer, cfg: LoRAConfig) -> dict[str, str]:
    """The targeted kernels (peft's matching: a target names the module's last component)."""
    modules = hf_modules(model)
    if ALL_LINEAR in cfg.target_modules:
        return {p: m for p, m in modules.items() if not m.endswith("lm_head")}
    chosen = {p: m for p, m in modules.items() if m.rsplit(".", 1)[-1] in cfg.target_modules}
    names = {m.rsplit(".", 1)[-1] for m in modules.values()}
    unknown = set(cfg.target_modules) - names
    if unknown:
        raise ValueError(f"lora.target_modules {sorted(unknown)} match no module; choose from {sorted(names)} "
                         f"or {ALL_LINEAR}")
    return chosen


def init_adapters(model: Transformer, cfg: LoRAConfig, key: Array) -> Adapters:
    """peft's init: a ~ kaiming_uniform(sqrt 5) = U(-1/sqrt(I), 1/sqrt(I)), b = 0 (so the model is unchanged)."""
    adapters: Adapters = {}
    for i, path in enumerate(sorted(target_paths(model, cfg))):
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


def lora_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, key: Array | None = None) -> Transformer:
    """A copy of `base` whose targeted kernels apply their adapters (dropout only when `key` is given).

    The base parameters are shared, not copied; `base` itself is left unchanged.
    """
    graphdef, state = nnx.split(base)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))
    for i, (path, ab) in enumerate(sorted(adapters.items())):
        variable = variable_at(model, path)
        layer_key = None if key is None else jax.random.fold_in(key, i)
        variable.set_value(LoRAKernel(variable.get_value(), ab["a"], ab["b"], layer_key, cfg.scaling, cfg.dropout))
    return model


def merged_model(base: Transformer, adapters: Adapters, cfg: LoRAConfig, dtype: Any = jnp.float32) -> Transformer:
    """`base` with ``w + scaling * a @ b`` in `dtype` in every targeted kernel (peft's `merge_and_unload`)."""
    graphdef, state = nnx.split(base)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))
    for path, ab in adapters.items():
        variable = variable_at(model, path)
        w = variable.get_value().astype(jnp.float32)
        variable.set_value((w + cfg.scaling * (ab["a"].astype(jnp.float32) @ ab["b"].astype(jnp.float32)))
                           .astype(dtype))
    return model


def adapter_tensors(base: Transformer, adapters: Adapters) -> dict[str, np.ndarray]:
    """peft's state-dict names and layouts: lora_A.weight [r, I], lora_B.weight [O, r]."""
    modules = hf_modules(base)
    out = {}
    for path, ab in adapters.items():
        prefix = f"base_model.model.{modules[path]}"
        out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(np.asarray(ab["a"], np.float32).T)
        out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(np.asarray(ab["b"], np.float32).T)
    return out


def adapter_config(base: Transformer, adapters: Adapters, cfg: LoRAConfig, base_model_path: str = "") -> dict:
    """A peft LoraConfig (as adapter_config.json) for these adapters."""
    modules = hf_modules(base)
    targets = sorted({modules[p].rsplit(".", 1)[-1] for p in adapters})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
            "lora_dropout": cfg.dropout, "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "base_model_name_or_path": base_model_path}


def save_adapter(base: Transformer, adapters: Adapters, cfg: LoRAConfig, out_dir: str | Path,
                 base_model_path: str = "") -> Path:
    """Write a peft adapter directory (adapter_config.json + adapter_model.safetensors) atomically."""
    tensors = adapter_tensors(base, adapters)
    config = adapter_config(base, adapters, cfg, base_model_path)

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return atomic_directory(out_dir, write)
