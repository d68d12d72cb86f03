"""A loaded transformers or peft model as a jaxcore model, from what it holds in memory: its config object and its
state dict (an edited weight or resized embeddings are what the jaxcore model gets, not the files it was loaded
from), and a peft model's adapter as LoRA stand-ins (`jaxcore.model.lora.lora_model`) that training continues.
torch is never imported here: the tensors are read through their own methods."""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcore.errors import CheckpointError
from jaxcore.hf import peft
from jaxcore.hf.convert import load_params_into
from jaxcore.hf.mapping import hf_to_params
from jaxcore.model import lora
from jaxcore.model.config import ConfigError
from jaxcore.model.families import config_from_hf
from jaxcore.model.hf_schema import check_hf_config
from jaxcore.model.state import flat_state
from jaxcore.model.transformer import Transformer, abstract_model


def is_peft_model(obj: Any) -> bool:
    """Whether `obj` is a peft `PeftModel` (duck-typed: peft need not be installed)."""
    return hasattr(obj, "peft_config") and hasattr(obj, "get_base_model")


def is_transformers_model(obj: Any) -> bool:
    """Whether `obj` is a loaded transformers model (a config object and a state dict)."""
    return callable(getattr(obj, "state_dict", None)) and hasattr(getattr(obj, "config", None), "to_json_string")


def _host(tensor: Any) -> np.ndarray:
    """A torch tensor as a float32 host array (bf16 and fp16 widen exactly)."""
    if getattr(tensor, "is_meta", False):
        raise CheckpointError("model: a weight is on the meta device (offloaded or not loaded); jaxcore needs every "
                              "weight in memory")
    return tensor.detach().float().cpu().numpy()


def _refuse_quantized(model: Any) -> None:
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False) or getattr(
            model, "hf_quantizer", None) is not None:
        raise CheckpointError("model: a quantized model; jaxcore trains unquantized weights (load it without "
                              "quantization_config)")


def from_state(config: Any, state: dict[str, Any], dtype: str = "float32", remat: bool = False) -> Transformer:
    """A jaxcore model (compute `dtype`, fp32 parameters, `remat`) of a transformers config object and a state dict
    with HF names (every tensor checked as `load_hf` checks the files)."""
    hf_config = json.loads(config.to_json_string(use_diff=True))       # what save_pretrained writes as config.json
    try:
        cfg = config_from_hf(check_hf_config(hf_config, "model.config"))
    except ConfigError as err:
        raise CheckpointError(str(err)) from err
    model = abstract_model(cfg, dtype=jnp.dtype(dtype), param_dtype=jnp.float32, remat=remat)
    shapes = {k: tuple(v.shape) for k, v in flat_state(model).items()}
    params = hf_to_params(cfg, {k: _host(v) for k, v in state.items()}, shapes)
    return load_params_into(model, params, jnp.float32)


def from_transformers(model: Any, dtype: str = "float32", remat: bool = False) -> Transformer:
    """A loaded transformers model as a jaxcore model, with the weights it holds now."""
    _refuse_quantized(model)
    return from_state(model.config, model.state_dict(), dtype, remat)


def from_peft(model: Any, cfg: lora.LoRAConfig, dtype: str = "float32", remat: bool = False) -> Transformer:
    """A peft model with one LoRA adapter (`cfg`, its config as jaxcore's) as its base model whose adapted kernels
    hold that adapter's current weights (`lora.lora_model`); the base's weights are those in memory too."""
    if len(model.peft_config) != 1:
        raise ValueError(f"model: a PeftModel with {len(model.peft_config)} adapters "
                         f"({', '.join(model.peft_config)}); jaxcore trains one")
    name = next(iter(model.peft_config))
    inner = model.get_base_model()
    _refuse_quantized(inner)
    state = inner.state_dict()
    base = from_state(inner.config, {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k},
                      dtype, remat)
    targets = peft.target_paths(base, cfg)
    adapted = {k.split(".lora_A.")[0] for k in state if ".lora_A." in k}
    if adapted != set(targets.values()):
        raise ValueError(f"model: the PeftModel adapts {len(adapted)} modules where its config selects "
                         f"{len(targets)} in jaxcore ({sorted(adapted ^ set(targets.values()))[0]} differs)")
    adapters = {p: {"a": jnp.asarray(_host(state[f"{m}.lora_A.{name}.weight"]).T),
                    "b": jnp.asarray(_host(state[f"{m}.lora_B.{name}.weight"]).T)} for p, m in targets.items()}
    return lora.lora_model(base, adapters, cfg, scalings=peft.adapter_scalings(base, cfg))
