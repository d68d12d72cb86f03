"""Llama (and models saved as Llama: SmolLM2, ...): the Llama-style decoder with optional MLP biases and
llama3 / linear RoPE scaling."""

from __future__ import annotations

from typing import Any

from jaxcore.model.config import ModelConfig
from jaxcore.model.families.base import DECODER_KEYS, Family, decoder_config, decoder_tensors, decoder_tiny_settings

# the tiny preset's RoPE scaling: llama3's, so that the tests cover it
TINY_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32}


def parse(hf: dict[str, Any]) -> ModelConfig:
    return decoder_config(hf, "llama", mlp_bias=bool(hf.get("mlp_bias", False)))


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    import transformers

    scaling = p.get("rope_scaling") or (TINY_ROPE_SCALING if p.get("preset") == "tiny" else None)
    rope = {"rope_theta": p.get("rope_theta", 10000.0), **(scaling or {"rope_type": "default"})}
    return transformers.LlamaConfig(**decoder_tiny_settings(p, vocab_size, tie, ids), rope_parameters=rope)


FAMILY = Family("llama", ("llama",), parse, decoder_tensors, DECODER_KEYS, tiny_config, gguf_types=("llama",))
