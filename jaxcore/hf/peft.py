"""LoRA adapters in peft's terms: targets chosen by HF module name as peft chooses them (q_proj, ..., down_proj,
a regular expression, or peft's "all-linear"; exclude_modules; ranks and alphas per module from rank_pattern and
alpha_pattern), and the adapter directory `peft.PeftModel.from_pretrained` loads (adapter_config.json +
adapter_model.safetensors with peft's key names). The transformation itself is `jaxcore.model.lora`.
A family may refuse it (`Family.lora_refusal`: GPT-2's fused c_attn Conv1D).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from jaxcore.hf.convert import atomic_directory
from jaxcore.hf.mapping import tensor_maps
from jaxcore.model.families import family_named
from jaxcore.model.lora import ALL_LINEAR, Adapters, LoRAConfig, init_adapters
from jaxcore.model.transformer import Transformer


def hf_modules(model: Transformer) -> dict[str, str]:
    """jaxcore kernel path -> HF module name (e.g. 'blocks.0.attn.q.kernel' -> 'model.layers.0.self_attn.q_proj')."""
    refusal = family_named(model.config.family).lora_refusal
    if refusal:
        raise ValueError(refusal)
    return {m.jax_paths[0]: m.hf_key.removesuffix(".weight") for m in tensor_maps(model.config)
            if m.kind == "transpose"}


def _names(modules: list[str] | set[str], names: Sequence[str] | str | None) -> set[str]:
    """The HF modules `names` selects by peft's rules: a string is a regular expression over the whole name; a
    list entry is a whole name or the end of one after a dot."""
    if names is None:
        return set()
    if isinstance(names, str):
        return {m for m in modules if re.fullmatch(names, m)}
    return {m for m in modules if m in names or any(m.endswith(f".{n}") for n in names)}


def _is_all_linear(targets: Sequence[str] | str) -> bool:
    return (targets.lower() == ALL_LINEAR) if isinstance(targets, str) else ALL_LINEAR in targets


def target_paths(model: Transformer, cfg: LoRAConfig) -> dict[str, str]:
    """The targeted kernels, {path: HF module name}, chosen as peft chooses them: `cfg.exclude_modules` first, then
    `cfg.target_modules` (each list entry must match some module)."""
    modules = hf_modules(model)
    names = set(modules.values())
    if _is_all_linear(cfg.target_modules):
        chosen = {m for m in names if not m.endswith("lm_head")}
    else:
        chosen = _names(names, cfg.target_modules)
        if isinstance(cfg.target_modules, str):
            unknown = [] if chosen else [cfg.target_modules]
        else:
            unknown = sorted(e for e in cfg.target_modules if not _names(names, [e]))
        if unknown:
            short = sorted({m.rsplit(".", 1)[-1] for m in names})
            raise ValueError(f"lora.target_modules {unknown} match no module; choose from {short} or {ALL_LINEAR}")
    chosen -= _names(names, cfg.exclude_modules)
    if not chosen:
        raise ValueError(f"lora.exclude_modules={cfg.exclude_modules!r} leaves no module of lora.target_modules to "
                         "adapt")
    return {p: m for p, m in modules.items() if m in chosen}


def init_peft_adapters(model: Transformer, cfg: LoRAConfig, key: jax.Array) -> Adapters:
    """peft-initialised adapters on the kernels `cfg.target_modules` names, each of its module's rank
    (`cfg.rank_pattern`)."""
    targets = target_paths(model, cfg)
    return init_adapters(model, targets, cfg, key, {p: cfg.rank_of(m) for p, m in targets.items()})


def adapter_scalings(model: Transformer, cfg: LoRAConfig) -> dict[str, float]:
    """{kernel path: alpha / rank} of every targeted kernel, from its module's patterns (peft's `scaling`)."""
    return {p: cfg.scaling_of(m) for p, m in target_paths(model, cfg).items()}


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
    """A peft LoraConfig (as adapter_config.json) for these adapters. target_modules lists the adapted modules'
    last names where peft, with exclude_modules, selects exactly those modules from them, else their whole
    names; rank_pattern and alpha_pattern are as given (peft matches them against the same names)."""
    modules = hf_modules(base)
    adapted = {modules[p] for p in adapters}
    targets = sorted({m.rsplit(".", 1)[-1] for m in adapted})
    names = set(modules.values())
    if _names(names, targets) - _names(names, cfg.exclude_modules) != adapted:
        targets = sorted(adapted)
    exclude = cfg.exclude_modules if cfg.exclude_modules is None or isinstance(cfg.exclude_modules, str) \
        else sorted(cfg.exclude_modules)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
            "lora_dropout": cfg.dropout, "target_modules": targets, "exclude_modules": exclude,
            "rank_pattern": dict(cfg.rank_pattern), "alpha_pattern": dict(cfg.alpha_pattern), "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
            "inference_mode": True, "modules_to_save": None, "base_model_name_or_path": base_model_path}


def save_adapter(base: Transformer, adapters: Adapters, cfg: LoRAConfig, out_dir: str | Path,
                 base_model_path: str = "") -> Path:
    """Write a peft adapter directory (adapter_config.json + adapter_model.safetensors) atomically."""
    tensors = adapter_tensors(base, adapters)
    config = adapter_config(base, adapters, cfg, base_model_path)

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return atomic_directory(out_dir, write)
