"""Where arrays live on a mesh: partition specs (tensor-parallel, FSDP, the ES masters), placing and
resharding parameters, and gathering a sharded model for export (jax.sharding only; no pmap)."""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcore.model import axes
from jaxcore.model.parameters import parameter_axes
from jaxcore.parallel.config import SHARD_MIN_SIZE
from jaxcore.parallel.meshes import MODEL, POP, replicated

log = logging.getLogger(__name__)


def fsdp_spec(shape: tuple[int, ...], axis: str, axis_size: int, min_size: int = SHARD_MIN_SIZE) -> P:
    """Shard the largest dimension divisible by the axis size; small arrays stay replicated."""
    if math.prod(shape) < min_size or axis_size == 1:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % axis_size == 0:
            spec: list[str | None] = [None] * len(shape)
            spec[dim] = axis
            return P(*spec)
    return P()


def fsdp_shardings(tree: Any, mesh: Mesh, axis: str, min_size: int = SHARD_MIN_SIZE) -> Any:
    """NamedShardings that FSDP-shard every large leaf of `tree` over `axis`."""
    size = mesh.shape[axis]
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(x.shape), axis, size, min_size)), tree)


def put_global(array: np.ndarray | jax.Array, sharding: NamedSharding) -> jax.Array:
    """Place a host array that every process holds in full as a global sharded array."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def replicate_tree(tree: Any, mesh: Mesh) -> Any:
    """Every array of `tree` replicated over `mesh` (host copies placed per device: multi-process safe)."""
    sharding = replicated(mesh)
    return jax.tree.map(lambda x: put_global(np.asarray(x), sharding), tree)


def replicate_model(model: Any, mesh: Mesh) -> Any:
    """Place every parameter of an NNX model on all devices of `mesh` (replicated), in place."""
    from flax import nnx

    nnx.update(model, replicate_tree(nnx.state(model), mesh))
    return model


# ----------------------------------------------------------------------------- (pop, model) meshes

# The Megatron layout as a table over the parameters' logical axes (`jaxcore.model.axes`): the axes split over
# the model axis. Column-parallel q/k/v/gate/up/lm_head split their outputs (and biases), row-parallel o/down
# their inputs, the token table its columns; every other axis stays whole.
TENSOR_PARALLEL_AXES = (axes.HEADS, axes.KV_HEADS, axes.FFN, axes.VOCAB_OUT, axes.TABLE_EMBED)


def tensor_parallel_spec(path: str, shape: tuple[int, ...], axis: str, axis_size: int,
                         head_dim: int | None = None) -> P:
    """The Megatron layout of parameter `path` (`TENSOR_PARALLEL_AXES` over its logical axes, aligned to the
    trailing dimensions of `shape`); replicated where no axis splits, or where its size does not divide.

    With `head_dim`, attention projections split only between whole heads (`axes.HEAD_AXES`): they stay
    replicated when their head count does not divide by `axis_size` (Gemma 3 270M's single key/value head on a
    model axis of 2), rather than splitting a head's dot product across devices."""
    names = parameter_axes(path)
    offset = len(shape) - len(names)
    dim = next((offset + d for d, name in enumerate(names) if name in TENSOR_PARALLEL_AXES), None)
    if axis_size == 1 or dim is None or offset < 0 or shape[dim] % axis_size:
        return P()
    if head_dim and names[dim - offset] in axes.HEAD_AXES and (shape[dim] // head_dim) % axis_size:
        return P()
    dims: list[str | None] = [None] * len(shape)
    dims[dim] = axis
    return P(*dims)


def master_partition(path: str, shape: tuple[int, ...], pop_size: int, model_size: int,
                     min_size: int = SHARD_MIN_SIZE, head_dim: int | None = None) -> P:
    """fp32 masters and optimizer state on a (pop, model) mesh of `pop_size * model_size` devices.

    A weight with a tensor-parallel dimension is split along it over "model" exactly as its compute copy
    is, and over "pop" along its most major dimension that divides (the tensor-parallel one itself, as
    ("model", "pop"), when that comes first): each device's slice then lies inside its compute slice, and
    re-assembling the compute weights is a contiguous gather over "pop", never a full weight. Every other
    leaf is split over all devices along its most major dimension that divides (contiguous gathers
    again); leaves smaller than `min_size` stay replicated. `head_dim`: as `tensor_parallel_spec`'s.
    """
    devices = pop_size * model_size
    if math.prod(shape) < min_size or devices == 1:
        return P()
    tp = tuple(tensor_parallel_spec(path, shape, MODEL, model_size, head_dim))
    tp_dim = next((d for d, axis in enumerate(tp) if axis), None)
    dims: list[Any] = list(tp) + [None] * (len(shape) - len(tp))
    if tp_dim is None:
        major = next((d for d in range(len(shape)) if shape[d] % devices == 0), None)
        if major is not None:
            dims[major] = (POP, MODEL)
        return P(*dims)
    for d in range(len(shape)) if pop_size > 1 else ():
        if d == tp_dim and shape[d] % devices == 0:
            dims[d] = (MODEL, POP)
            break
        if d != tp_dim and shape[d] % pop_size == 0:
            dims[d] = POP
            break
    return P(*dims)


def master_spec(path: str, shape: tuple[int, ...], mesh: Mesh, min_size: int = SHARD_MIN_SIZE,
                head_dim: int | None = None) -> P:
    """`master_partition` on an ES mesh (`es_mesh`)."""
    return master_partition(path, shape, mesh.shape[POP], mesh.shape[MODEL], min_size, head_dim)


def optimizer_state_shardings(optimizer: Any, params: Any, mesh: Mesh) -> Any:
    """Shardings for `optimizer.init(params)`: every params-shaped part (moments, momentum) sharded like
    the params it mirrors, the rest (step counters) replicated. `jit(optimizer.init)` alone would not
    follow the params: its zeros do not depend on them, so XLA replicates them."""
    import optax

    abstract = jax.eval_shape(optimizer.init, params)
    return optax.tree_utils.tree_map_params(optimizer, lambda _, p: p.sharding, abstract, params,
                                            transform_non_params=lambda _: replicated(mesh))


def factor_specs(w_spec: P, row_axis: str | None) -> tuple[P, P]:
    """Specs of a pair's factors a [P, I, r], b [P, O, r] consistent with their weight's spec (I, O)."""
    w_in, w_out = (tuple(w_spec) + (None, None))[:2]
    return P(row_axis, w_in, None), P(row_axis, w_out, None)


def shard_params(flat: dict[str, Any], spec_of: Any, mesh: Mesh, dtype: Any = None) -> dict[str, jax.Array]:
    """Each parameter at NamedSharding(mesh, spec_of(path, shape)), floats cast to `dtype` (if given).

    Device arrays are cast where they are (each device its own slice), then resharded in one compiled
    program (XLA gathers/slices as needed, moving compute-dtype bytes); host arrays are placed per
    tensor, each device receiving only its slice.
    """
    targets = tuple((path, NamedSharding(mesh, spec_of(path, tuple(v.shape)))) for path, v in flat.items())
    if all(_placed_as(flat[path], target, dtype) for path, target in targets):
        return dict(flat)         # already there (one device, or masters laid out as computed): no copy
    if all(isinstance(v, jax.Array) for v in flat.values()):
        if dtype is not None:
            flat = _caster(np.dtype(dtype).name)(flat)
        return _resharder(targets)(flat)
    out = {}
    for path, target in targets:
        value = np.asarray(flat[path])
        out[path] = put_global(value.astype(dtype) if dtype is not None and np.issubdtype(value.dtype, np.floating)
                               else value, target)
    return out


def _placed_as(value: Any, target: NamedSharding, dtype: Any) -> bool:
    """Whether `value` is a device array with `target`'s layout and, if floating, already in `dtype`."""
    if not isinstance(value, jax.Array) or not value.sharding.is_equivalent_to(target, value.ndim):
        return False
    return dtype is None or not np.issubdtype(value.dtype, np.floating) or value.dtype == np.dtype(dtype)


@functools.lru_cache(maxsize=4)
def _caster(dtype: str) -> Any:
    """Cast every float leaf to `dtype` in place (elementwise: each output keeps its input's sharding)."""
    return jax.jit(lambda flat: {k: v.astype(dtype) if jax.numpy.issubdtype(v.dtype, jax.numpy.floating) else v
                                 for k, v in flat.items()})


@functools.lru_cache(maxsize=16)
def _resharder(targets: tuple[tuple[str, NamedSharding], ...]) -> Any:
    return jax.jit(lambda flat: flat, out_shardings=dict(targets))


def gathered_model(model: Any) -> Any:
    """A copy of `model` whose parameters are host arrays, gathered from every process when sharded
    across hosts (a collective: every process must call it). For export (`save_hf`)."""
    from flax import nnx

    graphdef, state = nnx.split(model)

    def host(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return x
    return nnx.merge(graphdef, jax.tree.map(host, state))


# ----------------------------------------------------------------------------- loading into shardings


def master_shardings(mesh: Mesh, min_size: int = SHARD_MIN_SIZE, head_dim: int | None = None) -> Any:
    """(path, shape) -> the master weights' NamedSharding on `mesh` (`master_spec`): pass as
    `load_hf(..., shardings=)` / `load_model(..., shardings=)` to load straight into the ES masters' layout."""
    return lambda path, shape: NamedSharding(mesh, master_spec(path, tuple(shape), mesh, min_size, head_dim))


def fsdp_sharding_fn(mesh: Mesh, axis: str = "fsdp", min_size: int = SHARD_MIN_SIZE) -> Any:
    """(path, shape) -> the NamedSharding `fsdp_shardings` gives a leaf of that shape (GRPO's `fsdp`)."""
    return lambda path, shape: NamedSharding(mesh, fsdp_spec(tuple(shape), axis, mesh.shape[axis], min_size))


