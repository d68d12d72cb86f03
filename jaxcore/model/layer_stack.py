"""The two layouts of a model's blocks, and the moves between them.

Per layer (`blocks.{i}.attn.q.kernel`, an `nnx.List`): what HF and GGUF conversion, checkpoints, the EGGROLL
stand-ins, LoRA target paths, tensor-parallel specs and decoding use. Stacked (a `LayerStack`:
`blocks.body.attn.q.kernel` with a leading axis over layers 0 .. L-2, `blocks.last.attn.q.kernel` for the last):
what a training step runs under `lax.scan`, so that tracing and compiling it cost the same at any depth.

The moves copy every block parameter once (a stacked array cannot share memory with per-layer ones), so a trainer
keeps its state stacked and moves only at its edges: the rollout's decoding view, checkpoints, export.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

from jaxcore.model.state import module_copy
from jaxcore.model.transformer import LayerStack, Transformer, layer_of, stack_layers

BODY, LAST = "body", "last"
_LAYER_PATH = re.compile(r"^blocks\.(\d+)\.(.+)$")
_STACKED_PATH = re.compile(r"^blocks\.(body|last)\.(.+)$")


def scanned(model: Transformer) -> Transformer:
    """`model` with its blocks as a `LayerStack` (a stacked copy of the block parameters; stand-ins stack too;
    everything else shared)."""
    if model.scanned:
        return model
    out = module_copy(model)
    out.blocks = LayerStack.of(list(out.blocks))
    return out


def unrolled(model: Transformer) -> Transformer:
    """`model` with its blocks as a per-layer list (slices of a `LayerStack`: copies; everything else shared).
    Outside a trace each slice is one small program per parameter shape, whatever the depth."""
    if not model.scanned:
        return model
    out = module_copy(model)
    out.blocks = nnx.List(out.blocks.unstacked())
    return out


def is_stacked_path(path: str) -> bool:
    """Whether a dotted parameter path is in the stacked body (its arrays carry a leading layer axis)."""
    return path.startswith(f"blocks.{BODY}.")


def layer_axes(key_path: tuple[Any, ...]) -> int:
    """1 for a leaf of a parameter tree in the stacked body (a pure dict `{"blocks": {"body": ...}}` or a flat
    `{"blocks.body.…": ...}` dict), else 0: the leading axes that are layers, not the parameter's own."""
    names = ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in key_path)
    return int(is_stacked_path(names + "."))


def layer_matrices(params: Any) -> Any:
    """AdamW's decay mask in either layout: whether each parameter is a matrix of its layer (HF's AdamW decays
    matrices only; a stacked norm scale [L-1, D] is still a vector)."""
    return jax.tree_util.tree_map_with_path(lambda path, x: x.ndim - layer_axes(path) >= 2, params)


def _stack(values: list[Any]) -> Any:
    return jax.tree.map(stack_layers, *values)


def _unstack(value: Any, count: int) -> list[Any]:
    return [jax.tree.map(lambda x, i=i: layer_of(x, i), value) for i in range(count)]


def stack_params(tree: Mapping[Any, Any]) -> dict[Any, Any]:
    """A nested parameter dict (`nnx.to_pure_dict` of a per-layer model: `{"blocks": {0: ..., 1: ...}, ...}`) in
    the stacked layout (`{"blocks": {"body": stacked layers 0 .. L-2, "last": layer L-1}, ...}`)."""
    out = dict(tree)
    layers = [tree["blocks"][i] for i in sorted(tree["blocks"], key=int)]
    out["blocks"] = {LAST: layers[-1], **({BODY: _stack(layers[:-1])} if len(layers) > 1 else {})}
    return out


def unstack_params(tree: Mapping[Any, Any]) -> dict[Any, Any]:
    """The inverse of `stack_params`."""
    out = dict(tree)
    blocks = tree["blocks"]
    body = _unstack(blocks[BODY], jax.tree.leaves(blocks[BODY])[0].shape[0]) if BODY in blocks else []
    out["blocks"] = dict(enumerate([*body, blocks[LAST]]))
    return out


def stack_paths(values: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """A flat `{path: value}` dict (e.g. LoRA adapters on `blocks.{i}.…` kernels) in the stacked layout: every
    per-layer kind present in all of layers 0 .. L-2 becomes one `blocks.body.…` entry; the last layer's keep
    their own `blocks.last.…` path; paths outside the blocks stay."""
    out: dict[str, Any] = {}
    kinds: dict[str, dict[int, Any]] = {}
    for path, value in values.items():
        match = _LAYER_PATH.match(path)
        if match is None:
            out[path] = value
        elif int(match.group(1)) == num_layers - 1:
            out[f"blocks.{LAST}.{match.group(2)}"] = value
        else:
            kinds.setdefault(match.group(2), {})[int(match.group(1))] = value
    for kind, layers in kinds.items():
        if sorted(layers) != list(range(num_layers - 1)):
            raise ValueError(f"{kind} is on layers {sorted(layers)}, not on every layer: it cannot be stacked")
        out[f"blocks.{BODY}.{kind}"] = _stack([layers[i] for i in range(num_layers - 1)])
    return out


def unstack_paths(values: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The inverse of `stack_paths`."""
    out: dict[str, Any] = {}
    for path, value in values.items():
        match = _STACKED_PATH.match(path)
        if match is None:
            out[path] = value
        elif match.group(1) == LAST:
            out[f"blocks.{num_layers - 1}.{match.group(2)}"] = value
        else:
            for i, layer in enumerate(_unstack(value, num_layers - 1)):
                out[f"blocks.{i}.{match.group(2)}"] = layer
    return dict(sorted(out.items(), key=lambda item: _path_order(item[0])))


def _path_order(path: str) -> tuple[Any, ...]:
    match = _LAYER_PATH.match(path)
    return (0, int(match.group(1)), match.group(2)) if match else (1, 0, path)


def map_like(fn: Callable[[Any], Any], tree: Any, like: Any) -> Any:
    """`tree` with every subtree of the same structure as `like` replaced by `fn(subtree)`: e.g. an optimizer
    state's moments, which mirror the parameters, moved between layouts with them."""
    target = jax.tree.structure(like)
    return jax.tree.map(lambda sub: fn(sub) if jax.tree.structure(sub) == target else sub, tree,
                        is_leaf=lambda sub: jax.tree.structure(sub) == target)
