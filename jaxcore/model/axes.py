"""The logical axes of the model's parameters. Each layer declares the axes of its own parameters
(`param_axes` of `Linear`, `Embedding`, `Norm`), so that what a dimension means is said where the parameter is
made, and placement rules (`jaxcore.parallel.sharding`) and ES's choice of perturbed weights are tables over
these names rather than matches on parameter paths (as jax-llm-examples' `ArrayInfo` and MaxText's
`kernel_axes` do)."""

from __future__ import annotations

import functools
import re
from typing import Any

EMBED = "embed"                  # the model width, as a projection's input or output
HEADS = "heads"                  # query heads x head_dim (q's output, o's input)
KV_HEADS = "kv_heads"            # key/value heads x head_dim
HEAD_DIM = "head_dim"            # one head's width (the q/k norms)
FFN = "ffn"                      # the feed-forward width
VOCAB_IN = "vocab_in"            # the token table's rows
TABLE_EMBED = "table_embed"      # the token table's columns (the model width, read by row)
POSITIONS = "positions"          # a learned position table's rows
VOCAB_OUT = "vocab_out"          # the LM head's outputs

HEAD_AXES = (HEADS, KV_HEADS)           # split only between whole heads
EMBEDDING_ROWS = (VOCAB_IN, POSITIONS)  # the first axis of an embedding table

_LAYER = re.compile(r"^blocks\.(\d+|body|last)\.")      # a layer of the list, or of the scanned stack


def logical_axes(model: Any) -> dict[str, tuple[str, ...]]:
    """{parameter path: its logical axes} for every parameter a layer of `model` declares."""
    from flax import nnx

    out: dict[str, tuple[str, ...]] = {}
    for path, module in nnx.iter_modules(model):
        declared = getattr(module, "param_axes", None)
        if declared is None:
            continue
        prefix = "".join(f"{key}." for key in path)
        out.update({f"{prefix}{name}": axes for name, axes in declared().items()})
    return out


@functools.cache
def _transformer_axes() -> dict[str, tuple[str, ...]]:
    """The axes of every parameter the Transformer can have (one layer, every optional parameter on), by path
    with the layer index dropped."""
    from jaxcore.model.config import ModelConfig
    from jaxcore.model.transformer import Transformer

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
