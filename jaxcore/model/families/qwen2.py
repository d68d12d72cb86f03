"""Qwen2 / Qwen2.5: the Llama-style decoder with q/k/v biases (always) and none on the output projection."""

from __future__ import annotations

from typing import Any

from jaxcore.model.config import ModelConfig
from jaxcore.model.families.base import (
    DECODER_KEYS,
    Family,
    decoder_config,
    decoder_tensors,
    decoder_tiny_settings,
    default_rope,
)


def parse(hf: dict[str, Any]) -> ModelConfig:
    return decoder_config(hf, "qwen2", qkv_bias=True, out_bias=False)


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    import transformers

    return transformers.Qwen2Config(**decoder_tiny_settings(p, vocab_size, tie, ids), rope_parameters=default_rope(p))


FAMILY = Family("qwen2", ("qwen2",), parse, decoder_tensors, DECODER_KEYS, tiny_config, gguf_types=("qwen2",))
