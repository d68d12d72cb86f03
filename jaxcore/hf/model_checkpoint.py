"""jaxcore's own model checkpoints (orbax): parameters, the HF config, and the tokenizer files.

Layout of a checkpoint directory::

    CKPT/jaxcore.json   {"format": "jaxcore-model", "version": 1, "hf_config": {...}}
    CKPT/params/        orbax PyTree checkpoint of the flat parameter dict
    CKPT/tokenizer/     tokenizer files copied from the HF source, if any

`load_model(..., shardings=)` restores each parameter straight into its sharding (orbax reads only the
shards this process's devices hold); names and shapes are checked against the checkpoint's metadata
before any data is read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxcore.errors import read_json_object
from jaxcore.hf.convert import (
    CheckpointError,
    Shardings,
    atomic_directory,
    copy_tokenizer_files,
    load_hf,
    load_params_into,
    sharding_function,
)
from jaxcore.model.config import ConfigError
from jaxcore.model.families import config_from_hf
from jaxcore.model.hf_schema import check_hf_config
from jaxcore.model.state import flat_state
from jaxcore.model.transformer import Transformer, abstract_model
from jaxcore.outputs import demote_orbax_errors

FORMAT = "jaxcore-model"


def save_model(model: Transformer, path: str | os.PathLike,
               tokenizer_dir: str | os.PathLike | None = None, *, overwrite: bool = True, inputs: Any = ()) -> Path:
    """Write `model` as an orbax checkpoint directory, atomically (an existing one is replaced only with
    `overwrite`; `path` never overlaps `tokenizer_dir` or `inputs`: `jaxcore.outputs`)."""
    demote_orbax_errors()                          # a failed write is one line (`write_directory`), not orbax's logs
    params = {k: np.asarray(v) for k, v in flat_state(model).items()}
    meta = {"format": FORMAT, "version": 1, "hf_config": model.config.hf_config}

    def write(tmp: Path) -> None:
        checkpointer = ocp.PyTreeCheckpointer()
        try:
            checkpointer.save(str(tmp.absolute() / "params"), params)   # orbax needs absolute paths
        finally:
            checkpointer.close()              # its writer threads end before a failed write's `tmp` is removed
        if tokenizer_dir is not None:
            (tmp / "tokenizer").mkdir()
            copy_tokenizer_files(tokenizer_dir, tmp / "tokenizer")
        (tmp / "jaxcore.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    return atomic_directory(path, write, inputs=(tokenizer_dir, *inputs), overwrite=overwrite)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's jaxcore.json, or a CheckpointError naming what is wrong."""
    meta_path = Path(path) / "jaxcore.json"
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: not a jaxcore checkpoint (no jaxcore.json)")
    meta = read_json_object(meta_path, "jaxcore.json")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    try:
        check_hf_config(meta.get("hf_config"), f"{meta_path} hf_config")
    except ConfigError as err:
        raise CheckpointError(str(err)) from err
    return meta


@contextlib.contextmanager
def _reading(params_dir: Path) -> Iterator[None]:
    """Orbax's errors for a damaged params/ (missing or truncated metadata or array files) as one
    CheckpointError naming the directory."""
    try:
        yield
    except (ValueError, KeyError, TypeError, EOFError, FileNotFoundError) as err:
        if isinstance(err, CheckpointError):
            raise
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise CheckpointError(f"{params_dir}: damaged or incomplete orbax checkpoint ({detail})") from err


def _saved_shapes(params_dir: Path) -> dict[str, tuple[int, ...]]:
    """{parameter: shape} from the orbax metadata (no array data read)."""
    meta = ocp.PyTreeCheckpointer().metadata(str(params_dir.absolute()))
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    return {k: tuple(getattr(v, "shape", np.shape(v))) for k, v in dict(tree).items()}


def _check_params(params_dir: Path, saved: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    for key in sorted(set(saved) - set(expected)):
        raise CheckpointError(f"{params_dir}: unexpected tensor {key}")
    for key, shape in expected.items():
        if key not in saved:
            raise CheckpointError(f"{params_dir}: missing tensor {key}")
        if tuple(saved[key]) != shape:
            raise CheckpointError(f"{params_dir}: tensor {key} has shape {tuple(saved[key])}, expected {shape}")


def load_model(path: str | os.PathLike, dtype: str | Any = "float32", *,
               param_dtype: str | Any = "float32", remat: bool = False, shardings: Shardings = None) -> Transformer:
    """Load a checkpoint written by `save_model`.

    `shardings` (one sharding, {flat path: sharding}, or a function (path, shape) -> sharding): restore
    each parameter directly into its sharding, cast to `param_dtype`, each process reading only its
    shards; without it the parameters are restored to the host and put on the default device.
    """
    meta = read_meta(path)
    try:
        cfg = config_from_hf(meta["hf_config"])
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from err
    model = abstract_model(cfg, dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(param_dtype), remat=remat)
    expected = {k: tuple(v.shape) for k, v in flat_state(model).items()}
    params_dir = Path(path) / "params"
    if not params_dir.is_dir():
        raise CheckpointError(f"{params_dir}: missing")
    checkpointer = ocp.PyTreeCheckpointer()
    if shardings is None:
        with _reading(params_dir):
            restored = checkpointer.restore(str(params_dir.absolute()))
            if not isinstance(restored, dict):
                raise CheckpointError(f"{params_dir}: not a parameter dictionary")
        _check_params(params_dir, {k: tuple(np.shape(v)) for k, v in restored.items()}, expected)
        return load_params_into(model, restored, jnp.dtype(param_dtype))
    with _reading(params_dir):
        saved = _saved_shapes(params_dir)
    _check_params(params_dir, saved, expected)
    sharding_of = sharding_function(shardings)
    abstract = {k: jax.ShapeDtypeStruct(shape, jnp.dtype(param_dtype), sharding=sharding_of(k, shape))
                for k, shape in expected.items()}
    with _reading(params_dir):
        restored = checkpointer.restore(str(params_dir.absolute()), args=ocp.args.PyTreeRestore(
            item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract)))
    return load_params_into(model, restored, jnp.dtype(param_dtype))


def tokenizer_dir(path: str | os.PathLike) -> Path | None:
    """Where a checkpoint keeps its tokenizer files, if it has any."""
    tok = Path(path) / "tokenizer"
    return tok if tok.is_dir() and any(tok.iterdir()) else None


def tokenizer_dir_of(path: str | os.PathLike) -> Path | None:
    """Where `load_any` finds the tokenizer of `path`: a jaxcore checkpoint's `tokenizer_dir`, an HF directory
    itself; None for neither (or no path)."""
    if not path:
        return None
    path = Path(path)
    if (path / "jaxcore.json").is_file():
        return tokenizer_dir(path)
    return path if (path / "config.json").is_file() else None


def load_any(path: str | os.PathLike, dtype: str | Any = "float32", *, remat: bool = False,
             param_dtype: str | Any = "float32", shardings: Shardings = None) -> tuple[Transformer, Path | None]:
    """Load an HF directory or a jaxcore checkpoint; returns (model, tokenizer directory or None).
    With `shardings`, every parameter is read straight into its sharding (see `load_hf`, `load_model`)."""
    path = Path(path)
    options = {"remat": remat, "param_dtype": param_dtype, "shardings": shardings}
    if (path / "jaxcore.json").is_file():
        return load_model(path, dtype, **options), tokenizer_dir_of(path)
    if (path / "config.json").is_file():
        return load_hf(path, dtype, **options), tokenizer_dir_of(path)
    raise CheckpointError(f"{path}: neither an HF model directory (config.json) nor a jaxcore checkpoint "
                          "(jaxcore.json)")
