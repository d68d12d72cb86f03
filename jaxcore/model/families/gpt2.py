"""GPT-2: learned positions, LayerNorm, a plain GELU MLP, biases everywhere, and q/k/v fused into one Conv1D
(`c_attn`, stored [in, 3 * out]: split into three kernels)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.model.config import ModelConfig
from jaxcore.model.families.base import (
    ACTIVATIONS,
    Family,
    OptionalSize,
    Positive,
    Size,
    TensorLayout,
    TensorMap,
    require,
)

HF_KEYS: dict[str, Any] = {
    "vocab_size": Size, "n_embd": Size, "n_head": Size, "n_layer": Size, "n_positions": Size,
    "n_inner": OptionalSize, "layer_norm_epsilon": Positive, "activation_function": str, "tie_word_embeddings": bool,
    "scale_attn_weights": bool, "scale_attn_by_inverse_layer_idx": bool, "reorder_and_upcast_attn": bool,
    "add_cross_attention": bool,
}


def parse(hf: dict[str, Any]) -> ModelConfig:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise ConfigError(f"GPT-2 option {flag}=true is not supported")
    if not hf.get("scale_attn_weights", True):
        raise ConfigError("GPT-2 option scale_attn_weights=false is not supported")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS or ACTIVATIONS[act] == "silu":
        raise ConfigError(f"unsupported GPT-2 activation_function {act!r}")
    hidden = int(require(hf, "n_embd"))
    heads = int(require(hf, "n_head"))
    return ModelConfig(
        family="gpt2",
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(hf.get("n_inner") or 4 * hidden),
        num_layers=int(require(hf, "n_layer")),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=int(require(hf, "n_positions")),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        activation=ACTIVATIONS[act],
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        norm_type="layer",
        gated_mlp=False,
        learned_positions=True,
        hf_config_json=json.dumps(hf, sort_keys=True),
    )


def key_prefix(names: Collection[str]) -> str:
    """The prefix of a GPT-2 checkpoint's tensor names: "transformer." (as GPT2LMHeadModel saves them) or ""."""
    return "transformer." if any(k.startswith("transformer.") for k in names) else ""


def _maps(cfg: ModelConfig, prefix: str) -> Iterator[TensorMap]:
    yield TensorMap(f"{prefix}wte.weight", ("embed.table",))
    yield TensorMap(f"{prefix}wpe.weight", ("pos_embed.table",))
    for i in range(cfg.num_layers):
        hf, jx = f"{prefix}h.{i}", f"blocks.{i}"
        qkv = tuple(f"{jx}.attn.{n}" for n in "qkv")
        yield TensorMap(f"{hf}.attn.c_attn.weight", tuple(f"{p}.kernel" for p in qkv), "split3")
        yield TensorMap(f"{hf}.attn.c_attn.bias", tuple(f"{p}.bias" for p in qkv), "split3")
        for hf_name, jx_name in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down")):
            yield TensorMap(f"{hf}.{hf_name}.weight", (f"{jx}.{jx_name}.kernel",))
            yield TensorMap(f"{hf}.{hf_name}.bias", (f"{jx}.{jx_name}.bias",))
        for hf_name, jx_name in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            yield TensorMap(f"{hf}.{hf_name}.weight", (f"{jx}.{jx_name}.scale",))
            yield TensorMap(f"{hf}.{hf_name}.bias", (f"{jx}.{jx_name}.bias",))
    yield TensorMap(f"{prefix}ln_f.weight", ("final_norm.scale",))
    yield TensorMap(f"{prefix}ln_f.bias", ("final_norm.bias",))
    if not cfg.tie_word_embeddings:
        yield TensorMap("lm_head.weight", ("lm_head.kernel",), "transpose")


def tensors(cfg: ModelConfig, names: Collection[str] | None = None) -> TensorLayout:
    """Under "transformer." (written so on export), or without a prefix where the checkpoint has none."""
    return TensorLayout(list(_maps(cfg, "transformer." if names is None else key_prefix(names))))


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    import transformers

    return transformers.GPT2Config(vocab_size=vocab_size, n_embd=p["hidden"], n_layer=p["layers"], n_head=p["heads"],
                                   n_inner=p["intermediate"], n_positions=p["max_pos"], tie_word_embeddings=tie,
                                   **ids)


FAMILY = Family("gpt2", ("gpt2",), parse, tensors, HF_KEYS, tiny_config, tied_by_default=True,
                lora_refusal="LoRA is not supported for GPT-2 (fused c_attn); use a Llama/Qwen-style model",
                gguf_types=("gpt2",))
