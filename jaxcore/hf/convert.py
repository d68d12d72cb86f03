"""Hugging Face directory <-> jaxcore model: reading and writing the files.

Reads only config.json and safetensors (single file or sharded with an index); never unpickles.
Every problem (unknown model_type, missing/unexpected/misshapen tensor, a non-safetensors file)
raises `CheckpointError` with one line naming the key or file. Which tensor becomes which parameter
(the strict name mapping) is `jaxcore.hf.mapping`; its public names are re-exported here.

`load_hf` checks the mapping against the safetensors headers before reading any data, then builds one
parameter at a time; with `shardings` each parameter is created directly in its target sharding by
`jax.make_array_from_callback`, whose callback reads only the slice a device needs
(`safe_open(...).get_slice(key)[index]`), so no process ever holds the whole model on the host, and
a multi-host run reads only its own shards.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxcore.errors import CheckpointError, read_json_object  # noqa: F401  (CheckpointError: re-exported)
from jaxcore.hf.mapping import (  # noqa: F401  (TensorMap, tensor_maps, hf_to_params: re-exported)
    Index,
    ParamSource,
    TensorMap,
    checked_maps,
    hf_to_params,
    param_sources,
    params_to_hf,
    tensor_maps,
)
from jaxcore.model.config import ConfigError, ModelConfig
from jaxcore.model.families import config_from_hf
from jaxcore.model.hf_schema import check_hf_config
from jaxcore.model.state import flat_state
from jaxcore.model.transformer import Transformer, abstract_model
from jaxcore.outputs import current_umask, make_readable, write_directory  # noqa: F401  (re-exported)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                   "generation_config.json", "tokenizer.model")
_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
WEIGHT_DTYPES = ("F32", "BF16", "F16", "F64")     # safetensors dtypes the loader casts from
# Where `load_hf` / `load_model` put each parameter: one sharding for all, {flat path: sharding}, or
# a function (flat path, shape) -> sharding; None: the default device, as before.
Shardings = (jax.sharding.Sharding | Mapping[str, jax.sharding.Sharding]
             | Callable[[str, tuple[int, ...]], jax.sharding.Sharding] | None)


# ----------------------------------------------------------------------------- reading HF


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """Parse <dir>/config.json, its keys' types checked (`jaxcore.model.hf_schema`), or raise CheckpointError."""
    config_path = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: not a directory")
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: missing (an HF model directory needs config.json)")
    return read_json_config(config_path)


def read_json_config(config_path: str | os.PathLike) -> dict[str, Any]:
    """A config.json file (UTF-8 JSON, an object whose keys have the types jaxcore reads), or CheckpointError
    naming the file and the problem. Read and checked once per process while the file stays unchanged (a run's
    memory plan, mesh check and loading all ask for it); each call gets its own copy."""
    path = Path(config_path)
    try:
        stat = path.stat()
        stamp: tuple[Any, ...] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    except OSError:
        stamp = ()                                  # missing or unreadable: read_json_object names the problem
    return copy.deepcopy(_read_json_config(str(config_path), str(path.absolute()), stamp))


@functools.lru_cache(maxsize=16)
def _read_json_config(config_path: str, _absolute: str, _stamp: tuple[Any, ...]) -> dict[str, Any]:
    hf = read_json_object(config_path, "config.json")
    try:
        return check_hf_config(hf, config_path)
    except ConfigError as err:
        raise CheckpointError(str(err)) from err


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files transformers' `from_pretrained` reads: model.safetensors where there is one (even
    beside a sharded index), else the shards model.safetensors.index.json lists."""
    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index}: not a valid safetensors index ({err})") from err
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        pickled = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = f" (found {', '.join(pickled)}; jaxcore never unpickles)" if pickled else ""
        raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: listed in the safetensors index but missing")
    return files


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of an HF directory as host numpy arrays (bf16 via ml_dtypes). For tests and tools:
    `load_hf` never reads a whole directory at once."""
    tensors: dict[str, np.ndarray] = {}
    for file in _weight_files(Path(path)):
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a valid safetensors file ({err})") from err
    return tensors


def read_headers(path: str | os.PathLike) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """{tensor name: (file, shape)} from the safetensors headers of an HF directory; reads no tensor data."""
    headers: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in _weight_files(Path(path)):
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for key in handle.keys():
                    tensor = handle.get_slice(key)
                    if tensor.get_dtype() not in WEIGHT_DTYPES:
                        raise CheckpointError(f"{file}: tensor {key} has dtype {tensor.get_dtype()}; jaxcore reads "
                                              f"{', '.join(WEIGHT_DTYPES)} weights (not quantized ones)")
                    headers[key] = (file, tuple(tensor.get_shape()))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a valid safetensors file ({err})") from err
    return headers


class SliceReader:
    """Reads slices of HF tensors through `safe_open(...).get_slice(key)[index]` (never a whole file);
    keeps one handle per file open (memory-mapped) until closed."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> SliceReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        self._handles.clear()

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            try:
                self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="numpy"))
            except (SafetensorError, OSError) as err:
                raise CheckpointError(f"{file}: not a valid safetensors file ({err})") from err
        return self._handles[file]

    def read(self, source: ParamSource, index: Index, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """`index` of the parameter of `shape` that `source` describes, as a C-contiguous `dtype` array."""
        try:
            part = self._handle(source.file).get_slice(source.hf_key)[source.hf_index(index, shape)]
        except SafetensorError as err:
            raise CheckpointError(f"{source.file}: cannot read tensor {source.hf_key} ({err})") from err
        part = part.T if source.kind == "transpose" else part
        return np.asarray(part, dtype=dtype, order="C")


def sharding_function(shardings: Shardings) -> Callable[[str, tuple[int, ...]], jax.sharding.Sharding | None]:
    """`shardings` (one sharding, a {path: sharding} mapping, a function, or None) as a function."""
    if shardings is None:
        return lambda path, shape: None
    if isinstance(shardings, jax.sharding.Sharding):
        return lambda path, shape: shardings
    if isinstance(shardings, Mapping):
        def lookup(path: str, shape: tuple[int, ...]) -> jax.sharding.Sharding:
            if path not in shardings:
                raise ValueError(f"shardings: no sharding for parameter {path}")
            return shardings[path]
        return lookup
    if callable(shardings):
        return shardings
    raise TypeError(f"shardings must be a Sharding, a mapping or a function, got {type(shardings).__name__}")


def place(shape: tuple[int, ...], dtype: Any, sharding: jax.sharding.Sharding | None,
          read: Callable[[Index], np.ndarray]) -> jax.Array:
    """One array from `read(index)` host slices: with a sharding, each addressable device's slice is read
    (identical slices once) and placed directly; without one, the whole array on the default device."""
    full = tuple(slice(None) for _ in shape)
    if sharding is None:
        return jnp.asarray(read(full))
    cache: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def callback(index: Index) -> np.ndarray:
        key = tuple(s.indices(d)[:2] for s, d in zip(index, shape))
        if key not in cache:
            cache[key] = read(index)
        return cache[key]

    return jax.make_array_from_callback(tuple(shape), sharding, callback, dtype=np.dtype(dtype))


# ----------------------------------------------------------------------------- model state


def load_params_into(model: Transformer, flat: Mapping[str, Any], param_dtype: Any) -> Transformer:
    """Fill an (abstract) model's parameters from flat host arrays (or placed device arrays, kept
    where they are)."""
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)

    def value_of(path: str) -> Any:
        value = flat[path]
        if isinstance(value, jax.Array):
            return value if value.dtype == param_dtype else value.astype(param_dtype)
        return jnp.asarray(np.asarray(value).astype(param_dtype))

    def fill(node: dict, prefix: str) -> dict:
        out = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            out[key] = fill(value, path + ".") if isinstance(value, dict) else value_of(path)
        return out

    nnx.replace_by_pure_dict(state, fill(pure, ""))
    nnx.update(model, state)
    return model


def source_dtype(hf_config: dict[str, Any]) -> str:
    """The dtype the HF checkpoint was stored in (transformers 4.x `torch_dtype`, 5.x `dtype`)."""
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    return name if name in _DTYPES else "float32"


def load_hf(path: str | os.PathLike, dtype: str | Any = "float32", *, param_dtype: str | Any = "float32",
            remat: bool = False, shardings: Shardings = None) -> Transformer:
    """Load an HF directory as a jaxcore Transformer (compute `dtype`, fp32 master parameters).

    The mapping is checked against the safetensors headers first; then parameters are read one at a
    time, cast per slice. `shardings` (one sharding, {flat path: sharding}, or a function
    (path, shape) -> sharding) places each parameter directly in its sharding, every device reading
    only its slice; without it each parameter goes whole to the default device.
    """
    hf_config = read_hf_config(path)
    try:
        cfg = config_from_hf(hf_config)
    except ConfigError as err:
        raise CheckpointError(f"{Path(path) / 'config.json'}: {err}") from err
    param_dtype = jnp.dtype(param_dtype)
    model = abstract_model(cfg, dtype=jnp.dtype(dtype), param_dtype=param_dtype, remat=remat)
    shapes = {k: tuple(v.shape) for k, v in flat_state(model).items()}
    headers = read_headers(path)
    maps = checked_maps(cfg, {k: shape for k, (_, shape) in headers.items()}, shapes)
    sources = param_sources(maps, headers, shapes)
    sharding_of = sharding_function(shardings)
    params: dict[str, jax.Array] = {}
    with SliceReader() as reader:
        for name, shape in shapes.items():
            source = sources[name]
            params[name] = place(shape, param_dtype, sharding_of(name, shape),
                                 lambda index, source=source, shape=shape: reader.read(source, index, shape,
                                                                                      param_dtype))
    return load_params_into(model, params, param_dtype)


# ----------------------------------------------------------------------------- writing HF


def _shard(tensors: dict[str, np.ndarray], max_shard_bytes: int) -> list[dict[str, np.ndarray]]:
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    return shards


def write_safetensors(out: Path, tensors: dict[str, np.ndarray], max_shard_bytes: int) -> None:
    """Write model.safetensors, or shards plus model.safetensors.index.json."""
    shards = _shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def copy_tokenizer_files(src: str | os.PathLike, out: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files that exist in `src`."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, out / name)
            copied.append(name)
    return copied


def atomic_directory(out_dir: str | os.PathLike, write: Any, *, inputs: Any = (), overwrite: bool = True) -> Path:
    """Run `write(tmp_dir)` and move the result to `out_dir` only if it completed (`jaxcore.outputs.write_directory`:
    never over an input, one-line errors for a full or read-only disk)."""
    return write_directory(out_dir, write, inputs=inputs, overwrite=overwrite)


def save_hf(model: Transformer, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None,
            *, dtype: str | None = None, max_shard_bytes: int = 5 * 2**30, overwrite: bool = True,
            inputs: Any = ()) -> Path:
    """Export to an HF directory (config.json, safetensors, tokenizer files) atomically.

    `dtype` defaults to the dtype of the checkpoint the model was loaded from. An existing `out_dir` is replaced
    only with `overwrite`; `out_dir` never overlaps `tokenizer_dir` or `inputs` (`jaxcore.outputs`).
    """
    cfg: ModelConfig = model.config
    hf_config = cfg.hf_config
    dtype = dtype or source_dtype(hf_config)
    if dtype not in _DTYPES:
        raise CheckpointError(f"unsupported export dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    flat = {k: np.asarray(v).astype(_DTYPES[dtype]) for k, v in flat_state(model).items()}
    tensors = params_to_hf(cfg, flat)
    if "dtype" in hf_config or "torch_dtype" not in hf_config:
        hf_config["dtype"] = dtype
    else:
        hf_config["torch_dtype"] = dtype

    def write(tmp: Path) -> None:
        write_safetensors(tmp, tensors, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)

    return atomic_directory(out_dir, write, inputs=(tokenizer_dir, *inputs), overwrite=overwrite)
