"""jaxcore's own model checkpoints (orbax): parameters, the HF config, and the tokenizer files.

Layout of a checkpoint directory::

    CKPT/jaxcore.json   {"format": "jaxcore-model", "version": 1, "hf_config": {...}}
    CKPT/params/        orbax PyTree checkpoint of the flat parameter dict
    CKPT/tokenizer/     tokenizer files copied from the HF source, if any
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxcore.convert import (
    CheckpointError,
    atomic_directory,
    copy_tokenizer_files,
    flat_state,
    load_params_into,
)
from jaxcore.model import Transformer, abstract_model
from jaxcore.model_config import ConfigError, config_from_hf

FORMAT = "jaxcore-model"


def save_model(model: Transformer, path: str | os.PathLike,
               tokenizer_dir: str | os.PathLike | None = None) -> Path:
    """Write `model` as an orbax checkpoint directory, atomically."""
    params = {k: np.asarray(v) for k, v in flat_state(model).items()}
    meta = {"format": FORMAT, "version": 1, "hf_config": model.config.hf_config}

    def write(tmp: Path) -> None:
        checkpointer = ocp.PyTreeCheckpointer()
        checkpointer.save(str(tmp.absolute() / "params"), params)   # orbax needs absolute paths
        if tokenizer_dir is not None:
            (tmp / "tokenizer").mkdir()
            copy_tokenizer_files(tokenizer_dir, tmp / "tokenizer")
        (tmp / "jaxcore.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    return atomic_directory(path, write)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's jaxcore.json, or a CheckpointError naming what is wrong."""
    meta_path = Path(path) / "jaxcore.json"
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: not a jaxcore checkpoint (no jaxcore.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{meta_path}: invalid JSON ({err.msg})") from err
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_model(path: str | os.PathLike, dtype: str | Any = "float32", *,
               param_dtype: str | Any = "float32", remat: bool = False) -> Transformer:
    """Load a checkpoint written by `save_model`."""
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
    restored = ocp.PyTreeCheckpointer().restore(str(params_dir.absolute()))
    for key in sorted(set(restored) - set(expected)):
        raise CheckpointError(f"{params_dir}: unexpected tensor {key}")
    for key, shape in expected.items():
        if key not in restored:
            raise CheckpointError(f"{params_dir}: missing tensor {key}")
        if tuple(np.shape(restored[key])) != shape:
            raise CheckpointError(f"{params_dir}: tensor {key} has shape {np.shape(restored[key])}, "
                                  f"expected {shape}")
    return load_params_into(model, restored, jnp.dtype(param_dtype))


def tokenizer_dir(path: str | os.PathLike) -> Path | None:
    """Where a checkpoint keeps its tokenizer files, if it has any."""
    tok = Path(path) / "tokenizer"
    return tok if tok.is_dir() and any(tok.iterdir()) else None


def load_any(path: str | os.PathLike, dtype: str | Any = "float32", *, remat: bool = False
             ) -> tuple[Transformer, Path | None]:
    """Load an HF directory or a jaxcore checkpoint; returns (model, tokenizer directory or None)."""
    from jaxcore.convert import load_hf

    path = Path(path)
    if (path / "jaxcore.json").is_file():
        return load_model(path, dtype, remat=remat), tokenizer_dir(path)
    if (path / "config.json").is_file():
        return load_hf(path, dtype, remat=remat), path
    raise CheckpointError(f"{path}: neither an HF model directory (config.json) nor a jaxcore checkpoint "
                          "(jaxcore.json)")
