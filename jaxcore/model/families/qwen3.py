"""Qwen3: the Llama-style decoder with RMS norms on the queries and keys, and its own head_dim."""

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
    return decoder_config(hf, "qwen3", qk_norm=True)


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    import transformers

    head_dim = p.get("head_dim", 32 if p.get("preset") == "tiny" else p["hidden"] // p["heads"])
    return transformers.Qwen3Config(**decoder_tiny_settings(p, vocab_size, tie, ids), head_dim=head_dim,
                                    rope_parameters=default_rope(p))


FAMILY = Family("qwen3", ("qwen3",), parse, decoder_tensors, DECODER_KEYS, tiny_config, tied_by_default=True,
                gguf_types=("qwen3",))
