"""GGUF (llama.cpp / Ollama) checkpoints -> HF directories, through transformers' GGUF loader.

transformers dequantizes the GGUF tensors (float32 here) and rebuilds the tokenizer and its chat
template from the GGUF metadata; we drop the quantization record and write safetensors, so the result
is an ordinary HF directory that `jaxcore.load_hf` and transformers both read. Needs the `gguf`
package (`pip install 'jaxcore[gguf]'`).
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

from jaxcore.hf.convert import CheckpointError, atomic_directory
from jaxcore.model.families import registered


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_gguf(gguf_file: str | os.PathLike) -> tuple[object, object]:
    """(torch model in float32, tokenizer) dequantized from `gguf_file`; one-line `CheckpointError`s."""
    path = Path(gguf_file)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file not found")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise CheckpointError("reading GGUF needs the 'gguf' package: pip install gguf (or jaxcore[gguf])") from None
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    verbosity, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()          # its GGUF warnings are not ours to print
    transformers.logging.disable_progress_bar()
    gguf_bar = getattr(gguf_utils, "tqdm", None)        # the dequantizing bar (plain tqdm): a failure stays one line
    if gguf_bar is not None:
        gguf_utils.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except NotImplementedError as err:                  # gguf's "Dequantization for Q8_K is not yet implemented"
        what = "a tensor type transformers cannot dequantize" if "quantiz" in str(err).lower() else "not supported"
        raise CheckpointError(f"{path}: transformers cannot read this GGUF: {what} ({_first_line(err)})") from err
    except struct.error as err:                         # gguf's reader ran past the end of the file's bytes
        raise CheckpointError(f"{path}: the GGUF file ends early or is corrupt ({_first_line(err)})") from err
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise CheckpointError(f"{path}: transformers cannot read this GGUF ({_first_line(err)})") from err
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()
        if gguf_bar is not None:
            gguf_utils.tqdm = gguf_bar
    supported = [t for family in registered().values() for t in family.gguf_types]
    if model.config.model_type not in supported:
        raise CheckpointError(f"{path}: architecture {model.config.model_type!r} is not supported "
                              f"(supported: {', '.join(supported)})")
    return model, tokenizer


def gguf_to_hf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Write `out_dir` (config, safetensors, tokenizer, chat template) from a GGUF file, atomically (never over
    the GGUF file; an existing `out_dir` is replaced only with `overwrite`)."""
    model, tokenizer = load_gguf(gguf_file)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None                       # the weights are plain float32 tensors now

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return atomic_directory(out_dir, write, inputs=(gguf_file,), overwrite=overwrite)
