"""Model configuration: one frozen dataclass for every supported family, parsed from HF config.json."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from jaxcore.errors import ConfigError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "gemma3")
# model_type values that name a supported family under another name (Gemma 3's text tower).
MODEL_TYPES = {"gemma3_text": "gemma3", "gemma3": "gemma3"}
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"
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
    # Gemma 3: attention scale query_pre_attn_scalar**-0.5 (None: head_dim**-0.5), tanh soft-capping of the
    # final logits (None: off), and per-layer attention types: a "sliding_attention" layer sees the last
    # `sliding_window` positions and rotates with the local RoPE base. () means every layer is full.
    query_pre_attn_scalar: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float = 10000.0
    local_rope_scaling: tuple[tuple[str, Any], ...] = ()
    hf_config_json: str = "{}"         # the original config.json, written back on export

    @property
    def is_gpt2(self) -> bool:
        return self.family == "gpt2"

    @property
    def is_gemma(self) -> bool:
        return self.family == "gemma3"

    @property
    def gated_mlp(self) -> bool:
        return not self.is_gpt2

    @property
    def norm_type(self) -> str:
        """"layer" (GPT-2), "rms" (Llama/Qwen: scale * x), or "rms_offset" (Gemma: (1 + scale) * x)."""
        return "layer" if self.is_gpt2 else "rms_offset" if self.is_gemma else "rms"

    @property
    def sandwich_norms(self) -> bool:
        """Norms after attention and after the MLP too (Gemma), not only before them."""
        return self.is_gemma

    @property
    def embed_scale(self) -> float | None:
        """Gemma multiplies the token embeddings by sqrt(hidden_size); None for the others."""
        return self.hidden_size ** 0.5 if self.is_gemma else None

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` (None: full attention)."""
        if self.layer_types and self.layer_types[layer] == SLIDING_ATTENTION:
            return self.sliding_window
        return None

    def layer_rope(self, layer: int) -> tuple[float, dict[str, Any]]:
        """(theta, rope parameters) of layer `layer`: the local base on sliding layers, the global one elsewhere."""
        if self.layer_window(layer) is not None:
            return self.local_rope_theta, dict(self.local_rope_scaling)
        return self.rope_theta, self.rope_params()

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


def _rope_settings(hf: dict[str, Any], params: dict[str, Any] | None = None, default_theta: float = 10000.0
                   ) -> tuple[float, tuple[tuple[str, Any], ...]]:
    """Read RoPE theta and scaling from either transformers 4.x or 5.x config layouts (or from `params`, one
    layer type's entry of a per-layer-type `rope_parameters`)."""
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


def _gemma3_layer_types(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """`layer_types` as written, or transformers' default from `sliding_window_pattern` (every n-th layer full)."""
    types = hf.get("layer_types")
    if types is None:
        pattern = int(hf.get("sliding_window_pattern") or 6)
        types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {FULL_ATTENTION, SLIDING_ATTENTION}:
        raise ConfigError(f"layer_types must list {num_layers} of {FULL_ATTENTION!r}/{SLIDING_ATTENTION!r}, "
                          f"got {types!r}")
    return tuple(types)


def _gemma3_rope(hf: dict[str, Any]) -> tuple[tuple[float, tuple], tuple[float, tuple]]:
    """((theta, scaling) of full layers, (theta, scaling) of sliding layers) from transformers 5.x's per-layer-type
    `rope_parameters` or 4.x's rope_theta / rope_scaling / rope_local_base_freq."""
    params = hf.get("rope_parameters") or {}
    if FULL_ATTENTION in params or SLIDING_ATTENTION in params:
        full = _rope_settings(hf, params.get(FULL_ATTENTION) or {}, 1_000_000.0)
        local = _rope_settings(hf, params.get(SLIDING_ATTENTION) or {}, 10_000.0)
        return full, local
    full = _rope_settings(hf, {**(hf.get("rope_scaling") or {}), **params}, 1_000_000.0)
    local = _rope_settings(hf, {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)})
    return full, local


def _gemma3_config(hf: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text model (model_type gemma3_text, or the text_config of a multimodal gemma3 config)."""
    text = {**hf["text_config"], "model_type": "gemma3_text"} if hf.get("model_type") == "gemma3" else hf
    if text.get("use_bidirectional_attention"):
        raise ConfigError("Gemma 3 with use_bidirectional_attention=true is not supported")
    act = text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh"
    if _ACTIVATIONS.get(act) != "gelu_tanh":
        raise ConfigError(f"unsupported hidden_activation {act!r} for gemma3; expected gelu_pytorch_tanh")
    num_heads, hidden = int(_require(text, "num_attention_heads")), int(_require(text, "hidden_size"))
    num_layers = int(_require(text, "num_hidden_layers"))
    (theta, scaling), (local_theta, local_scaling) = _gemma3_rope(text)
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
        vocab_size=int(_require(text, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_require(text, "intermediate_size")),
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
        rope_theta=theta,
        rope_scaling=scaling,
        query_pre_attn_scalar=float(text.get("query_pre_attn_scalar", 256)),
        final_logit_softcap=None if cap is None else float(cap),
        sliding_window=None if window is None else int(window),
        layer_types=_gemma3_layer_types(text, num_layers),
        local_rope_theta=local_theta,
        local_rope_scaling=local_scaling,
        hf_config_json=json.dumps(text, sort_keys=True),
    )


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from a parsed HF config.json, or raise ConfigError naming the problem."""
    model_type = hf.get("model_type")
    family = MODEL_TYPES.get(model_type, model_type)
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {', '.join([*SUPPORTED_FAMILIES[:-1], *MODEL_TYPES])}")
    if family == "gpt2":
        return _gpt2_config(hf)
    if family == "gemma3":
        if model_type == "gemma3" and not isinstance(hf.get("text_config"), dict):
            raise ConfigError("config.json of model_type 'gemma3' has no 'text_config'")
        return _gemma3_config(hf)
    return _decoder_config(hf, family)
