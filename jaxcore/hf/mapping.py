"""The strict HF <-> jaxcore tensor-name mapping: which HF tensor becomes which jaxcore parameter(s), in
which layout, checked against the shapes a config implies. Pure names, shapes and slices: no file I/O
(reading and writing the files is `jaxcore.hf.convert`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path

import numpy as np

from jaxcore.errors import CheckpointError
from jaxcore.model.config import ModelConfig
from jaxcore.model.families import TensorLayout, TensorMap, family_named

# Buffers some HF checkpoints carry that are not parameters (causal-mask and RoPE caches).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def tensor_layout(cfg: ModelConfig, names: Collection[str] | None = None) -> TensorLayout:
    """The HF <-> jaxcore layout of `cfg`'s family (`names`: a checkpoint's tensor names, for the layouts a
    family reads in more than one way; None: the one it writes)."""
    return family_named(cfg.family).tensors(cfg, names)


def tensor_maps(cfg: ModelConfig, names: Collection[str] | None = None) -> list[TensorMap]:
    """The full HF <-> jaxcore mapping for a config (`tensor_layout`'s maps)."""
    return tensor_layout(cfg, names).maps


def _check_shape(key: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise CheckpointError(f"tensor {key}: shape {tuple(shape)}, expected {tuple(expected)}")


def _split_sizes(m: TensorMap, expected_shapes: Mapping[str, tuple[int, ...]]) -> list[int]:
    return [int(np.prod(expected_shapes[p][-1:])) for p in m.jax_paths]


def checked_maps(cfg: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                 expected_shapes: Mapping[str, tuple[int, ...]]) -> list[TensorMap]:
    """The mapping for `cfg`, checked against the HF tensors' `shapes` ({name: shape}, e.g. from the
    headers): an unexpected, missing or misshapen tensor raises a one-line CheckpointError."""
    layout = tensor_layout(cfg, shapes)
    maps = layout.maps
    known = {m.hf_key for m in maps}
    for key in sorted(shapes):
        ignorable = (key.endswith(_IGNORED_SUFFIXES) or (key == "lm_head.weight" and cfg.tie_word_embeddings)
                     or key.startswith(layout.ignored_prefixes))
        if key not in known and not ignorable:
            raise CheckpointError(f"unexpected tensor {key} for model_type {cfg.family}")
    for m in maps:
        if m.hf_key not in shapes:
            raise CheckpointError(f"missing tensor {m.hf_key} for model_type {cfg.family}")
        shape = tuple(shapes[m.hf_key])
        if m.kind == "split3":
            _check_shape(m.hf_key, shape, (*expected_shapes[m.jax_paths[0]][:-1],
                                              sum(_split_sizes(m, expected_shapes))))
        for path in m.jax_paths:
            if m.kind == "transpose":
                _check_shape(m.hf_key, shape, tuple(expected_shapes[path][::-1]))
            elif m.kind == "split3":
                _check_shape(m.hf_key, (*shape[:-1], expected_shapes[path][-1]), expected_shapes[path])
            else:
                _check_shape(m.hf_key, shape, expected_shapes[path])
    return maps


def hf_to_params(cfg: ModelConfig, tensors: dict[str, np.ndarray],
                 expected_shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Map HF tensors (all in memory) to flat jaxcore parameter paths, strictly."""
    maps = checked_maps(cfg, {k: tuple(v.shape) for k, v in tensors.items()}, expected_shapes)
    params: dict[str, np.ndarray] = {}
    for m in maps:
        array = tensors[m.hf_key]
        if m.kind == "split3":
            parts = np.split(array, np.cumsum(_split_sizes(m, expected_shapes))[:-1], axis=-1)
        else:
            parts = [array.T if m.kind == "transpose" else array]
        for path, part in zip(m.jax_paths, parts):
            params[path] = np.ascontiguousarray(part)
    return params

Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class ParamSource:
    """Where one jaxcore parameter lives in the HF files: `hf_key`, read as `kind` ("copy",
    "transpose", or "split3" with the parameter at columns [offset, offset + width) of the last axis)."""

    hf_key: str
    file: Path
    kind: str
    offset: int = 0

    def hf_index(self, index: Index, shape: tuple[int, ...]) -> Index:
        """The slice of the HF tensor that holds `index` of the (jaxcore-layout) parameter of `shape`."""
        bounds = tuple(slice(*s.indices(d)[:2]) for s, d in zip(index, shape))
        if len(bounds) != len(shape) or any(s.indices(d)[2] != 1 for s, d in zip(index, shape)):
            raise ValueError(f"{self.hf_key}: unsupported index {index} for shape {shape}")
        if self.kind == "transpose":
            return bounds[::-1]
        if self.kind == "split3":
            last = bounds[-1]
            return (*bounds[:-1], slice(last.start + self.offset, last.stop + self.offset))
        return bounds


def param_sources(maps: list[TensorMap], headers: Mapping[str, tuple[Path, tuple[int, ...]]],
                  expected_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, ParamSource]:
    """{jaxcore path: ParamSource} for a checked mapping."""
    sources: dict[str, ParamSource] = {}
    for m in maps:
        file = headers[m.hf_key][0]
        offsets = np.concatenate([[0], np.cumsum(_split_sizes(m, expected_shapes))]) if m.kind == "split3" \
            else np.zeros(len(m.jax_paths) + 1, int)
        for path, offset in zip(m.jax_paths, offsets):
            sources[path] = ParamSource(m.hf_key, file, m.kind, int(offset))
    return sources

def params_to_hf(cfg: ModelConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `hf_to_params`: flat jaxcore parameters to HF tensor names and layouts."""
    tensors: dict[str, np.ndarray] = {}
    for m in tensor_maps(cfg):
        parts = [params[p] for p in m.jax_paths]
        if m.kind == "split3":
            tensors[m.hf_key] = np.concatenate(parts, axis=-1)
        else:
            tensors[m.hf_key] = np.ascontiguousarray(parts[0].T if m.kind == "transpose" else parts[0])
    return tensors
