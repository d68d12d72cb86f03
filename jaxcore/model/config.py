"""Model configuration: one frozen dataclass for every supported family; each family
(`jaxcore.model.families`) parses its config.json into it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxcore.errors import ConfigError  # noqa: F401  (re-exported)

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"


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
    norm_type: str = "rms"             # "rms" (scale * x), "rms_offset" ((1 + scale) * x: Gemma), "layer" (GPT-2)
    gated_mlp: bool = True             # act(gate) * up (GPT-2: act(up))
    sandwich_norms: bool = False       # norms after attention and after the MLP too (Gemma), not only before
    scaled_embeddings: bool = False    # token embeddings times sqrt(hidden_size) (Gemma)
    learned_positions: bool = False    # a position embedding table (GPT-2) instead of RoPE
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
    def embed_scale(self) -> float | None:
        """sqrt(hidden_size) where the token embeddings are scaled (Gemma); None elsewhere."""
        return self.hidden_size ** 0.5 if self.scaled_embeddings else None

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
    def hf_config(self) -> dict[str, Any]:
        return json.loads(self.hf_config_json)

    def rope_params(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

