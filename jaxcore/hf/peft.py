"""LoRA adapters in peft's terms: targets chosen by HF module name (q_proj, ..., down_proj, or peft's
"all-linear"), and the adapter directory `peft.PeftModel.from_pretrained` loads (adapter_config.json +
adapter_model.safetensors with peft's key names). The transformation itself is `jaxcore.model.lora`.
A family may refuse it (`Family.lora_refusal`: GPT-2's fused c_attn Conv1D).
"""

from __future__ import annotations

import json
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


def init_peft_adapters(model: Transformer, cfg: LoRAConfig, key: jax.Array) -> Adapters:
    """peft-initialised adapters on the kernels `cfg.target_modules` names."""
    return init_adapters(model, target_paths(model, cfg), cfg, key)


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
