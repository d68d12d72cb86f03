"""Model configuration: one frozen dataclass for every supported family, parsed from HF config.json."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxcore.errors import ConfigError  # noqa: F401  (re-exported)

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gpt2")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer (hashable, so it can live in an NNX graphdef)."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    norm_eps: float
    tie_word_embeddings: bool
    activation: str = "silu"           # "silu" (gated MLP) | "gelu_tanh" | "gelu"
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()   # sorted items of HF rope parameters
    hf_config_json: str = "{}"         # the original config.json, written back on export

    @property
    def is_gpt2(self) -> bool:
        return self.family == "gpt2"

    @property
    def gated_mlp(self) -> bool:
        return not self.is_gpt2

    @property
    def norm_type(self) -> str:
        return "layer" if self.is_gpt2 else "rms"

    @property
    def learned_positions(self) -> bool:
        return self.is_gpt2

    @property
    def hf_config(self) -> dict[str, Any]:
        return json.loads(self.hf_config_json)

    def rope_params(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _require(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ConfigError(f"config.json is missing '{key}' (model_type={hf.get('model_type')!r})")
    return hf[key]


def _rope_settings(hf: dict[str, Any]) -> tuple[float, tuple[tuple[str, Any], ...]]:
    """Read RoPE theta and scaling from either transformers 4.x or 5.x config layouts."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise ConfigError(f"unsupported rope type {rope_type!r}; supported: default, linear, llama3")
    params["rope_type"] = rope_type
    params.pop("type", None)
    if rope_type == "default":
        return theta, ()
    return theta, tuple(sorted(params.items()))


def _decoder_config(hf: dict[str, Any], family: str) -> ModelConfig:
    if hf.get("use_sliding_window"):
        raise ConfigError("sliding-window attention (use_sliding_window=true) is not supported")
    act = _require(hf, "hidden_act")
    if act not in ("silu", "swish"):
        raise ConfigError(f"unsupported hidden_act {act!r} for {family}; expected silu")
    num_heads = int(_require(hf, "num_attention_heads"))
    hidden = int(_require(hf, "hidden_size"))
    head_dim = hf.get("head_dim") or hidden // num_heads
    theta, scaling = _rope_settings(hf)
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family=family,
        vocab_size=int(_require(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_require(hf, "intermediate_size")),
        num_layers=int(_require(hf, "num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        activation="silu",
        qkv_bias=attention_bias or family == "qwen2",      # Qwen2 always has q/k/v biases
        out_bias=attention_bias and family != "qwen2",
        mlp_bias=bool(hf.get("mlp_bias", False)) and family == "llama",
        qk_norm=family == "qwen3",
        rope_theta=theta,
        rope_scaling=scaling,
        hf_config_json=json.dumps(hf, sort_keys=True),
    )


def _gpt2_config(hf: dict[str, Any]) -> ModelConfig:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise ConfigError(f"GPT-2 option {flag}=true is not supported")
    if not hf.get("scale_attn_weights", True):
        raise ConfigError("GPT-2 option scale_attn_weights=false is not supported")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS or _ACTIVATIONS[act] == "silu":
        raise ConfigError(f"unsupported GPT-2 activation_function {act!r}")
    hidden = int(_require(hf, "n_embd"))
    heads = int(_require(hf, "n_head"))
    return ModelConfig(
        family="gpt2",
        vocab_size=int(_require(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(hf.get("n_inner") or 4 * hidden),
        num_layers=int(_require(hf, "n_layer")),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=int(_require(hf, "n_positions")),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        activation=_ACTIVATIONS[act],
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        hf_config_json=json.dumps(hf, sort_keys=True),
    )


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from a parsed HF config.json, or raise ConfigError naming the problem."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_FAMILIES)}")
    if model_type == "gpt2":
        return _gpt2_config(hf)
    return _decoder_config(hf, model_type)
