"""What a model family is to jaxcore (`Family`): how its config.json becomes a `ModelConfig`, which HF tensor
becomes which parameter (`TensorMap`), the config.json keys it reads with their types, and a tiny random
transformers config for tests. The Llama-style decoder parts that several families share are here too."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Iterator
from typing import Annotated, Any

from annotated_types import Ge, Gt

from jaxcore.errors import ConfigError
from jaxcore.model.config import ModelConfig

Size = Annotated[int, Ge(1)]
OptionalSize = Annotated[int, Ge(1)] | None
Positive = Annotated[float, Gt(0)]
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu": "gelu"}


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One HF tensor and the jaxcore parameter(s) it becomes.

    kind: "copy" (same layout), "transpose" (nn.Linear [out, in] -> kernel [in, out]),
    "split3" (a fused q/k/v tensor split along the last axis into q, k, v).
    """

    hf_key: str
    jax_paths: tuple[str, ...]
    kind: str = "copy"


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    """A checkpoint's tensors for a config: the maps, and the name prefixes of tensors a text model leaves out
    (a multimodal checkpoint's vision tower)."""

    maps: list[TensorMap]
    ignored_prefixes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Family:
    """Everything family-specific about one model family; the one `Transformer` runs every family.

    `parse` turns a config.json dict into a `ModelConfig` (a `ConfigError` naming what it does not support);
    `tensors(cfg, names)` lays out the HF tensors (`names`: the checkpoint's tensor names, None when exporting);
    `hf_keys` are the config.json keys `parse` reads with their types and ranges (checked before it runs);
    `tiny_config(preset, vocab_size, tie, ids)` is a transformers config of a preset's size (tests, benchmarks).
    """

    name: str
    model_types: tuple[str, ...]
    parse: Callable[[dict[str, Any]], ModelConfig]
    tensors: Callable[[ModelConfig, Collection[str] | None], TensorLayout]
    hf_keys: dict[str, Any]
    tiny_config: Callable[[dict[str, Any], int, bool, dict[str, int]], Any]
    tied_by_default: bool = False            # a tiny checkpoint ties its embeddings unless told otherwise
    norm_offset: float = 1.0                 # a tiny checkpoint's norm scales: offset + noise (0: (1 + scale) norms)
    lora_refusal: str | None = None          # why peft's LoRA cannot target this family (None: it can)
    gguf_types: tuple[str, ...] = ()         # GGUF architectures transformers reads into this family


def require(hf: dict[str, Any], key: str) -> Any:
    """hf[key], or a ConfigError naming the missing key."""
    if key not in hf:
        raise ConfigError(f"config.json is missing '{key}' (model_type={hf.get('model_type')!r})")
    return hf[key]


def rope_settings(hf: dict[str, Any], params: dict[str, Any] | None = None, default_theta: float = 10000.0
                  ) -> tuple[float, tuple[tuple[str, Any], ...]]:
    """RoPE theta and scaling from either transformers 4.x or 5.x config layouts (or from `params`, one layer
    type's entry of a per-layer-type `rope_parameters`)."""
    if params is None:
        params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    params = dict(params)
    theta = float(params.pop("rope_theta", hf.get("rope_theta", default_theta)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise ConfigError(f"unsupported rope type {rope_type!r}; supported: default, linear, llama3")
    params["rope_type"] = rope_type
    params.pop("type", None)
    if rope_type == "default":
        return theta, ()
    check_rope_scaling(rope_type, params, "rope_parameters" if hf.get("rope_parameters") else "rope_scaling")
    return theta, tuple(sorted(params.items()))


# what each RoPE scaling reads (transformers' required keys; it has no defaults for them: a missing one is its
# KeyError when the model is built)
ROPE_KEYS = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def check_rope_scaling(rope_type: str, params: dict[str, Any], where: str = "rope_scaling") -> None:
    """A ConfigError naming the first key of `rope_type`'s scaling that is missing or not a positive number, or
    llama3's low_freq_factor not below its high_freq_factor (they would divide by zero), so that a config is refused
    where it is read (convert, load) rather than when the rotary tables are first made."""
    for key in ROPE_KEYS[rope_type]:
        if key not in params:
            raise ConfigError(f"config.json's {where} ({rope_type}) is missing '{key}' (transformers has no "
                              "default for it): add it")
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ConfigError(f"config.json's {where} ({rope_type}): '{key}' is {value!r}; expected a positive "
                              "number")
    if rope_type == "llama3" and not params["low_freq_factor"] < params["high_freq_factor"]:
        raise ConfigError(f"config.json's {where} (llama3): low_freq_factor {params['low_freq_factor']} must be "
                          f"below high_freq_factor {params['high_freq_factor']}")


# -- the Llama-style decoder (Llama, Qwen2, Qwen3, Gemma 3 and families registered like them) ------------------

DECODER_KEYS: dict[str, Any] = {
    "vocab_size": Size, "hidden_size": Size, "intermediate_size": Size, "num_hidden_layers": Size,
    "num_attention_heads": Size, "num_key_value_heads": OptionalSize, "head_dim": OptionalSize,
    "max_position_embeddings": Size, "rms_norm_eps": Positive, "rope_theta": Positive, "hidden_act": str,
    "tie_word_embeddings": bool, "attention_bias": bool, "mlp_bias": bool, "use_sliding_window": bool,
    "rope_scaling": dict[str, Any] | None, "rope_parameters": dict[str, Any] | None,
}


def decoder_config(hf: dict[str, Any], family: str, **features: Any) -> ModelConfig:
    """A Llama-style config.json as a `ModelConfig` of `family`; `features` are the family's own settings
    (e.g. qk_norm=True), which win over what the file says."""
    if hf.get("use_sliding_window"):
        raise ConfigError("sliding-window attention (use_sliding_window=true) is not supported")
    act = require(hf, "hidden_act")
    if act not in ("silu", "swish"):
        raise ConfigError(f"unsupported hidden_act {act!r} for {family}; expected silu")
    num_heads = int(require(hf, "num_attention_heads"))
    hidden = int(require(hf, "hidden_size"))
    theta, scaling = rope_settings(hf)
    attention_bias = bool(hf.get("attention_bias", False))
    settings: dict[str, Any] = dict(
        family=family,
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(require(hf, "intermediate_size")),
        num_layers=int(require(hf, "num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        activation="silu", qkv_bias=attention_bias, out_bias=attention_bias,
        rope_theta=theta, rope_scaling=scaling, hf_config_json=json.dumps(hf, sort_keys=True))
    return ModelConfig(**{**settings, **features})


def decoder_maps(cfg: ModelConfig, root: str = "model.") -> Iterator[TensorMap]:
    """The Llama-style tensor names (`root`: where the `model.` tensors are)."""
    yield TensorMap(f"{root}embed_tokens.weight", ("embed.table",))
    for i in range(cfg.num_layers):
        hf, jx = f"{root}layers.{i}", f"blocks.{i}"
        for name in "qkvo":
            yield TensorMap(f"{hf}.self_attn.{name}_proj.weight", (f"{jx}.attn.{name}.kernel",), "transpose")
            if cfg.out_bias if name == "o" else cfg.qkv_bias:
                yield TensorMap(f"{hf}.self_attn.{name}_proj.bias", (f"{jx}.attn.{name}.bias",))
        if cfg.qk_norm:
            yield TensorMap(f"{hf}.self_attn.q_norm.weight", (f"{jx}.attn.q_norm.scale",))
            yield TensorMap(f"{hf}.self_attn.k_norm.weight", (f"{jx}.attn.k_norm.scale",))
        for name in ("gate", "up", "down"):
            yield TensorMap(f"{hf}.mlp.{name}_proj.weight", (f"{jx}.mlp.{name}.kernel",), "transpose")
            if cfg.mlp_bias:
                yield TensorMap(f"{hf}.mlp.{name}_proj.bias", (f"{jx}.mlp.{name}.bias",))
        yield TensorMap(f"{hf}.input_layernorm.weight", (f"{jx}.attn_norm.scale",))
        if cfg.sandwich_norms:      # post_attention_layernorm is after attention, not before the MLP
            yield TensorMap(f"{hf}.post_attention_layernorm.weight", (f"{jx}.attn_post_norm.scale",))
            yield TensorMap(f"{hf}.pre_feedforward_layernorm.weight", (f"{jx}.mlp_norm.scale",))
            yield TensorMap(f"{hf}.post_feedforward_layernorm.weight", (f"{jx}.mlp_post_norm.scale",))
        else:
            yield TensorMap(f"{hf}.post_attention_layernorm.weight", (f"{jx}.mlp_norm.scale",))
    yield TensorMap(f"{root}norm.weight", ("final_norm.scale",))
    if not cfg.tie_word_embeddings:
        yield TensorMap("lm_head.weight", ("lm_head.kernel",), "transpose")


def decoder_tensors(cfg: ModelConfig, names: Collection[str] | None = None) -> TensorLayout:
    """The Llama-style layout (a family's `tensors`)."""
    return TensorLayout(list(decoder_maps(cfg)))


def decoder_tiny_settings(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> dict[str, Any]:
    """The transformers config arguments of a Llama-style decoder at a preset's size."""
    return dict(vocab_size=vocab_size, hidden_size=p["hidden"], num_hidden_layers=p["layers"],
                num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
                intermediate_size=p["intermediate"], max_position_embeddings=p["max_pos"],
                tie_word_embeddings=tie, rms_norm_eps=1e-5, **ids)


def default_rope(p: dict[str, Any]) -> dict[str, Any]:
    """transformers 5.x `rope_parameters` of a preset without scaling."""
    return {"rope_theta": p.get("rope_theta", 10000.0), "rope_type": "default"}
