"""Gemma 3's text model (model_type gemma3_text, or the text_config of a multimodal gemma3 config): the
Llama-style decoder with (1 + scale) RMS norms before and after attention and the MLP, q/k norms, embeddings
scaled by sqrt(hidden_size), a GELU-tanh gated MLP, sliding-window layers with their own RoPE base, a query
scale of its own and optional final-logit soft-capping."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.model.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig
from jaxcore.model.families.base import (
    ACTIVATIONS,
    DECODER_KEYS,
    Family,
    OptionalSize,
    Positive,
    TensorLayout,
    decoder_maps,
    decoder_tiny_settings,
    require,
    rope_settings,
)

log = logging.getLogger(__name__)

HF_KEYS: dict[str, Any] = {
    **DECODER_KEYS, "sliding_window": OptionalSize, "sliding_window_pattern": OptionalSize,
    "rope_local_base_freq": Positive, "query_pre_attn_scalar": Positive, "attn_logit_softcapping": Positive | None,
    "final_logit_softcapping": Positive | None, "hidden_activation": str | None,
    "use_bidirectional_attention": bool | None, "layer_types": list[str] | None,
}
# A multimodal checkpoint (model_type gemma3): where its text tower's `model.` tensors live (transformers 5.x,
# 4.x), and the vision tensors beside them, which a text-only model leaves out (and does not export).
TEXT_TOWER_ROOTS = {"model.language_model.": ("model.vision_tower.", "model.multi_modal_projector."),
                    "language_model.model.": ("vision_tower.", "multi_modal_projector.")}
# the tiny preset: a window shorter than the test prompts, local and global layers, a query scale that is not
# head_dim, and linear RoPE scaling on the global layers (as the 4B+ models have)
TINY = dict(head_dim=32, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_theta=100.0)


def _layer_types(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """`layer_types` as written, or transformers' default from `sliding_window_pattern` (every n-th layer full)."""
    types = hf.get("layer_types")
    if types is None:
        pattern = int(hf.get("sliding_window_pattern") or 6)
        types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {FULL_ATTENTION, SLIDING_ATTENTION}:
        raise ConfigError(f"layer_types must list {num_layers} of {FULL_ATTENTION!r}/{SLIDING_ATTENTION!r}, "
                          f"got {types!r}")
    return tuple(types)


def _rope(hf: dict[str, Any]) -> tuple[tuple[float, tuple], tuple[float, tuple]]:
    """((theta, scaling) of full layers, (theta, scaling) of sliding layers) from transformers 5.x's per-layer-type
    `rope_parameters` or 4.x's rope_theta / rope_scaling / rope_local_base_freq."""
    params = hf.get("rope_parameters") or {}
    if FULL_ATTENTION in params or SLIDING_ATTENTION in params:
        full = rope_settings(hf, params.get(FULL_ATTENTION) or {}, 1_000_000.0)
        local = rope_settings(hf, params.get(SLIDING_ATTENTION) or {}, 10_000.0)
        return full, local
    full = rope_settings(hf, {**(hf.get("rope_scaling") or {}), **params}, 1_000_000.0)
    local = rope_settings(hf, {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)})
    return full, local


def parse(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("model_type") == "gemma3" and not isinstance(hf.get("text_config"), dict):
        raise ConfigError("config.json of model_type 'gemma3' has no 'text_config'")
    text = {**hf["text_config"], "model_type": "gemma3_text"} if hf.get("model_type") == "gemma3" else hf
    if text.get("use_bidirectional_attention"):
        raise ConfigError("Gemma 3 with use_bidirectional_attention=true is not supported")
    act = text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh"
    if ACTIVATIONS.get(act) != "gelu_tanh":
        raise ConfigError(f"unsupported hidden_activation {act!r} for gemma3; expected gelu_pytorch_tanh")
    num_heads, hidden = int(require(text, "num_attention_heads")), int(require(text, "hidden_size"))
    num_layers = int(require(text, "num_hidden_layers"))
    (theta, scaling), (local_theta, local_scaling) = _rope(text)
    window = text.get("sliding_window", 4096)
    if window is not None and int(window) < 1:
        raise ConfigError(f"sliding_window must be >= 1, got {window}")
    if text.get("attn_logit_softcapping") is not None:
        # transformers' Gemma3Attention keeps the value but never passes it to its attention functions (Gemma 3
        # replaced Gemma 2's capping with q/k norms): the model HF runs, and so ours, has no attention capping.
        log.info("gemma3: attn_logit_softcapping=%s is ignored, as transformers ignores it",
                 text["attn_logit_softcapping"])
    cap = text.get("final_logit_softcapping")
    attention_bias = bool(text.get("attention_bias", False))
    return ModelConfig(
        family="gemma3",
        vocab_size=int(require(text, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(require(text, "intermediate_size")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(text.get("num_key_value_heads") or num_heads),
        head_dim=int(text.get("head_dim") or hidden // num_heads),
        max_position_embeddings=int(text.get("max_position_embeddings", 131_072)),
        norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", True)),
        activation="gelu_tanh",
        qkv_bias=attention_bias,
        out_bias=attention_bias,
        qk_norm=True,
        norm_type="rms_offset",
        sandwich_norms=True,
        scaled_embeddings=True,
        rope_theta=theta,
        rope_scaling=scaling,
        query_pre_attn_scalar=float(text.get("query_pre_attn_scalar", 256)),
        final_logit_softcap=None if cap is None else float(cap),
        sliding_window=None if window is None else int(window),
        layer_types=_layer_types(text, num_layers),
        local_rope_theta=local_theta,
        local_rope_scaling=local_scaling,
        hf_config_json=json.dumps(text, sort_keys=True),
    )


def tensors(cfg: ModelConfig, names: Collection[str] | None = None) -> TensorLayout:
    """"model." (gemma3_text), or a multimodal checkpoint's text tower, its vision tensors left out."""
    for root, vision in TEXT_TOWER_ROOTS.items():
        if names is not None and f"{root}embed_tokens.weight" in names:
            return TensorLayout(list(decoder_maps(cfg, root)), vision)
    return TensorLayout(list(decoder_maps(cfg)))


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    """A Gemma3TextConfig: layer_types as given, or every `pattern`-th layer (default 6) global."""
    import transformers

    p = {**(TINY if p.get("preset") == "tiny" else {}), **p}
    types = list(p.get("layer_types") or ["sliding_attention" if (i + 1) % p.get("pattern", 6) else "full_attention"
                                          for i in range(p["layers"])])
    rope = {"full_attention": {"rope_theta": p.get("rope_theta", 10000.0),
                               **(p.get("rope_scaling") or {"rope_type": "default"})},
            "sliding_attention": {"rope_theta": p.get("rope_local_theta", 10000.0), "rope_type": "default"}}
    return transformers.Gemma3TextConfig(
        **{**decoder_tiny_settings(p, vocab_size, tie, ids), "rms_norm_eps": 1e-6},
        head_dim=p.get("head_dim", p["hidden"] // p["heads"]), rope_parameters=rope, layer_types=types,
        sliding_window=p.get("sliding_window", 4096), query_pre_attn_scalar=p.get("query_pre_attn_scalar", 256),
        final_logit_softcapping=p.get("final_logit_softcapping"),
        attn_logit_softcapping=p.get("attn_logit_softcapping"), hidden_activation="gelu_pytorch_tanh")


FAMILY = Family("gemma3", ("gemma3_text", "gemma3"), parse, tensors, HF_KEYS, tiny_config, tied_by_default=True,
                norm_offset=0.0, gguf_types=("gemma3_text",))
