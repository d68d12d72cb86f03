"""The Transformer's parameters by path ('blocks.3.attn.q.kernel'): their logical axes, as the layers that make them
declare them (`jaxcore.model.axes`), and which of them are embedding tables or the LM head. Above the
Transformer: the table is read off a Transformer with every optional parameter on."""

from __future__ import annotations

import functools
import re

from jaxcore.model.axes import EMBEDDING_ROWS, VOCAB_IN, VOCAB_OUT, logical_axes
from jaxcore.model.config import ModelConfig
from jaxcore.model.transformer import Transformer

_LAYER = re.compile(r"^blocks\.(\d+|body|last)\.")      # a layer of the list, or of the scanned stack


@functools.cache
def _transformer_axes() -> dict[str, tuple[str, ...]]:
    """The axes of every parameter the Transformer can have (one layer, every optional parameter on), by path
    with the layer index dropped."""
    every = ModelConfig(family="", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=4, max_position_embeddings=8, norm_eps=1e-6,
                        tie_word_embeddings=False, qkv_bias=True, out_bias=True, mlp_bias=True, qk_norm=True,
                        norm_type="layer", sandwich_norms=True, learned_positions=True)
    return {_LAYER.sub("blocks.", path): axes for path, axes in logical_axes(Transformer(every, rngs=None)).items()}


def parameter_axes(path: str) -> tuple[str, ...]:
    """The logical axes of the Transformer's parameter `path` (e.g. "blocks.3.attn.q.kernel": (embed, heads));
    () for a path the Transformer does not have (an adapter's, say)."""
    return _transformer_axes().get(_LAYER.sub("blocks.", path), ())


def is_embedding(path: str) -> bool:
    """An embedding table (tokens or positions): its rows are looked up, not multiplied."""
    return parameter_axes(path)[:1] in tuple((rows,) for rows in EMBEDDING_ROWS)


def is_token_table(path: str) -> bool:
    """The token embedding table (also the LM head where the model ties them)."""
    return parameter_axes(path)[:1] == (VOCAB_IN,)


def is_lm_head(path: str) -> bool:
    """An untied LM head (its outputs are the vocabulary)."""
    return VOCAB_OUT in parameter_axes(path)
