"""The strict HF <-> jaxcore tensor-name mapping: which HF tensor becomes which jaxcore parameter(s), in
which layout, checked against the shapes a config implies. Pure names, shapes and slices: no file I/O
(reading and writing the files is `jaxcore.hf.convert`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxcore.errors import CheckpointError
from jaxcore.model.config import ModelConfig

# Buffers some HF checkpoints carry that are not parameters (causal-mask and RoPE caches).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
# A multimodal Gemma 3 checkpoint (model_type gemma3): where its text tower's `model.` tensors live (transformers
# 5.x, 4.x), and the vision tensors beside them, which a text-only model leaves out (and does not export).
_TEXT_TOWER_ROOTS = {"model.language_model.": ("model.vision_tower.", "model.multi_modal_projector."),
                     "language_model.model.": ("vision_tower.", "multi_modal_projector.")}


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One HF tensor and the jaxcore parameter(s) it becomes.

    kind: "copy" (same layout), "transpose" (nn.Linear [out, in] -> kernel [in, out]),
    "split3" (GPT-2 fused c_attn, split along the last axis into q, k, v).
    """

    hf_key: str
    jax_paths: tuple[str, ...]
    kind: str = "copy"


def _decoder_maps(cfg: ModelConfig, root: str = "model.") -> Iterator[TensorMap]:
    yield TensorMap(f"{root}embed_tokens.weight", ("embed.table",))
    for i in range(cfg.num_layers):
        hf, jx = f"{root}layers.{i}", f"blocks.{i}"
        for name in "qkvo":
            yield TensorMap(f"{hf}.self_attn.{name}_proj.weight", (f"{jx}.attn.{name}.kernel",),
                            "transpose")
            has_bias = cfg.out_bias if name == "o" else cfg.qkv_bias
            if has_bias:
                yield TensorMap(f"{hf}.self_attn.{name}_proj.bias", (f"{jx}.attn.{name}.bias",))
        if cfg.qk_norm:
            yield TensorMap(f"{hf}.self_attn.q_norm.weight", (f"{jx}.attn.q_norm.scale",))
            yield TensorMap(f"{hf}.self_attn.k_norm.weight", (f"{jx}.attn.k_norm.scale",))
        for name in ("gate", "up", "down"):
            yield TensorMap(f"{hf}.mlp.{name}_proj.weight", (f"{jx}.mlp.{name}.kernel",), "transpose")
            if cfg.mlp_bias:
                yield TensorMap(f"{hf}.mlp.{name}_proj.bias", (f"{jx}.mlp.{name}.bias",))
        yield TensorMap(f"{hf}.input_layernorm.weight", (f"{jx}.attn_norm.scale",))
        if cfg.sandwich_norms:      # Gemma: post_attention_layernorm is after attention, not before the MLP
            yield TensorMap(f"{hf}.post_attention_layernorm.weight", (f"{jx}.attn_post_norm.scale",))
            yield TensorMap(f"{hf}.pre_feedforward_layernorm.weight", (f"{jx}.mlp_norm.scale",))
            yield TensorMap(f"{hf}.post_feedforward_layernorm.weight", (f"{jx}.mlp_post_norm.scale",))
        else:
            yield TensorMap(f"{hf}.post_attention_layernorm.weight", (f"{jx}.mlp_norm.scale",))
    yield TensorMap(f"{root}norm.weight", ("final_norm.scale",))
    if not cfg.tie_word_embeddings:
        yield TensorMap("lm_head.weight", ("lm_head.kernel",), "transpose")


def _gpt2_maps(cfg: ModelConfig, prefix: str) -> Iterator[TensorMap]:
    yield TensorMap(f"{prefix}wte.weight", ("embed.table",))
    yield TensorMap(f"{prefix}wpe.weight", ("pos_embed.table",))
    for i in range(cfg.num_layers):
        hf, jx = f"{prefix}h.{i}", f"blocks.{i}"
        qkv = tuple(f"{jx}.attn.{n}" for n in "qkv")
        yield TensorMap(f"{hf}.attn.c_attn.weight", tuple(f"{p}.kernel" for p in qkv), "split3")
        yield TensorMap(f"{hf}.attn.c_attn.bias", tuple(f"{p}.bias" for p in qkv), "split3")
        for hf_name, jx_name in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"),
                                 ("mlp.c_proj", "mlp.down")):
            yield TensorMap(f"{hf}.{hf_name}.weight", (f"{jx}.{jx_name}.kernel",))
            yield TensorMap(f"{hf}.{hf_name}.bias", (f"{jx}.{jx_name}.bias",))
        for hf_name, jx_name in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            yield TensorMap(f"{hf}.{hf_name}.weight", (f"{jx}.{jx_name}.scale",))
            yield TensorMap(f"{hf}.{hf_name}.bias", (f"{jx}.{jx_name}.bias",))
    yield TensorMap(f"{prefix}ln_f.weight", ("final_norm.scale",))
    yield TensorMap(f"{prefix}ln_f.bias", ("final_norm.bias",))
    if not cfg.tie_word_embeddings:
        yield TensorMap("lm_head.weight", ("lm_head.kernel",), "transpose")


def tensor_maps(cfg: ModelConfig, gpt2_prefix: str = "transformer.", root: str = "model.") -> list[TensorMap]:
    """The full HF <-> jaxcore mapping for a config (`root`: where a decoder's `model.` tensors are)."""
    if cfg.is_gpt2:
        return list(_gpt2_maps(cfg, gpt2_prefix))
    return list(_decoder_maps(cfg, root))


def text_tower_root(cfg: ModelConfig, tensors: Mapping[str, Any]) -> str:
    """Where a Gemma 3 checkpoint keeps its text model: "model." (gemma3_text), or a multimodal checkpoint's
    language-model prefix; "model." for every other family."""
    if cfg.is_gemma:
        for root in _TEXT_TOWER_ROOTS:
            if f"{root}embed_tokens.weight" in tensors:
                return root
    return "model."

def _check_shape(key: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise CheckpointError(f"tensor {key}: shape {tuple(shape)}, expected {tuple(expected)}")


def gpt2_key_prefix(tensors: Mapping[str, Any]) -> str:
    """The prefix of a GPT-2 checkpoint's tensor names: "transformer." (as GPT2LMHeadModel saves them) or ""."""
    return "transformer." if any(k.startswith("transformer.") for k in tensors) else ""


def _split_sizes(m: TensorMap, expected_shapes: Mapping[str, tuple[int, ...]]) -> list[int]:
    return [int(np.prod(expected_shapes[p][-1:])) for p in m.jax_paths]


def checked_maps(cfg: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                 expected_shapes: Mapping[str, tuple[int, ...]]) -> list[TensorMap]:
    """The mapping for `cfg`, checked against the HF tensors' `shapes` ({name: shape}, e.g. from the
    headers): an unexpected, missing or misshapen tensor raises a one-line CheckpointError."""
    root = text_tower_root(cfg, shapes)
    maps = tensor_maps(cfg, gpt2_key_prefix(shapes) if cfg.is_gpt2 else "transformer.", root)
    known = {m.hf_key for m in maps}
    for key in sorted(shapes):
        ignorable = (key.endswith(_IGNORED_SUFFIXES) or (key == "lm_head.weight" and cfg.tie_word_embeddings)
                     or key.startswith(_TEXT_TOWER_ROOTS.get(root, ())))
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
