"""The logical axes of the model's parameters. Each layer declares the axes of its own parameters
(`param_axes` of `Linear`, `Embedding`, `Norm`), so that what a dimension means is said where the parameter is
made, and placement rules (`jaxcore.parallel.sharding`) and ES's choice of perturbed weights are tables over
these names rather than matches on parameter paths (as jax-llm-examples' `ArrayInfo` and MaxText's
`kernel_axes` do). The bottom of the model package: the Transformer's parameters by path are in
`jaxcore.model.parameters`."""

from __future__ import annotations

from typing import Any

from flax import nnx

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


def logical_axes(model: Any) -> dict[str, tuple[str, ...]]:
    """{parameter path: its logical axes} for every parameter a layer of `model` declares."""
    out: dict[str, tuple[str, ...]] = {}
    for path, module in nnx.iter_modules(model):
        declared = getattr(module, "param_axes", None)
        if declared is None:
            continue
        prefix = "".join(f"{key}." for key in path)
        out.update({f"{prefix}{name}": axes for name, axes in declared().items()})
    return out
