"""What jaxcore.trl's trainers take as `model` and `processing_class`: a local directory, or a loaded transformers or
peft model and a loaded tokenizer, used as they are in memory (the weights they hold now, a peft model's adapter,
a chat template edited after loading) rather than reloaded from the directory they came from."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from jaxcore.hf import in_memory
from jaxcore.model.lora import LoRAConfig


def local_directory(value: Any, name: str) -> str:
    """`value`, a path naming a local directory (a one-line ValueError otherwise)."""
    if not Path(value).is_dir():
        raise ValueError(f"{name}={os.fspath(value)!r}: not a local directory (jaxcore reads models and tokenizers "
                         "from disk; nothing is downloaded)")
    return os.fspath(value)


class ModelSource:
    """The trainer's `model`: a directory (`path`), or a loaded transformers / peft model (`loaded`; `path` is then
    its `name_or_path` where that is a local directory, else None)."""

    def __init__(self, model: Any) -> None:
        self.loaded = None
        if isinstance(model, (str, os.PathLike)):
            self.path: str | None = local_directory(model, "model")
            self.name = Path(self.path).name
            return
        if not (in_memory.is_peft_model(model) or in_memory.is_transformers_model(model)):
            raise TypeError(f"model must be a local directory or a loaded transformers or peft model, got "
                            f"{type(model).__name__}")
        self.loaded = model
        name = os.fspath(getattr(model, "name_or_path", "") or "")
        self.path = name if name and Path(name).is_dir() else None
        self.name = Path(name).name or "model"

    @property
    def peft_config(self) -> Any:
        """A loaded peft model's adapter config (None for any other model)."""
        if self.loaded is None or not in_memory.is_peft_model(self.loaded):
            return None
        return self.loaded.peft_config[self.loaded.active_adapter]

    def model(self, lora: LoRAConfig | None, dtype: str, remat: bool) -> Any:
        """What the run trains: the directory, or the loaded model converted from what it holds now (a peft model:
        its base with the adapter `lora` describes), made anew for each run, which owns and updates its arrays."""
        if self.loaded is None:
            return self.path
        if in_memory.is_peft_model(self.loaded):
            return in_memory.from_peft(self.loaded, lora, dtype, remat)
        return in_memory.from_transformers(self.loaded, dtype, remat)


class TokenizerSource:
    """The trainer's `processing_class`: a directory, or a loaded tokenizer saved as it is now (`save_pretrained`)
    into a directory of its own for the trainer's lifetime, which the run reads and its export copies."""

    def __init__(self, processing_class: Any, model_path: str | None) -> None:
        self._saved = None
        if processing_class is None:
            self.path = model_path
        elif isinstance(processing_class, (str, os.PathLike)):
            self.path = local_directory(processing_class, "processing_class")
        elif callable(getattr(processing_class, "save_pretrained", None)):
            self._saved = tempfile.TemporaryDirectory(prefix="jaxcore-processing-class-")
            processing_class.save_pretrained(self._saved.name)
            self.path = self._saved.name
        else:
            raise TypeError(f"processing_class must be a tokenizer or a local directory, got "
                            f"{type(processing_class).__name__}")
        if self.path is None:
            raise ValueError("processing_class: give the tokenizer (the model's name_or_path is not a local directory "
                             "with its files)")
