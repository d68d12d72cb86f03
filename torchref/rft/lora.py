"""LoRA with peft: target modules per model family, wrapping a model, and merging adapters back in."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxcore.hf.convert import CheckpointError, copy_tokenizer_files, read_hf_config, source_dtype
from torchref.rft.errors import RFTError
from torchref.rft.precision import DTYPES

_ATTN_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": _ATTN_MLP, "qwen2": _ATTN_MLP, "qwen3": _ATTN_MLP, "mistral": _ATTN_MLP,
    "gpt2": ("c_attn", "c_proj", "c_fc"),
}


def lora_targets(model_type: str, override: Sequence[str] | None = None) -> list[str]:
    """LoRA target module names for a model family (or the override)."""
    if override:
        return list(override)
    if model_type not in LORA_TARGETS:
        raise RFTError(f"no default LoRA targets for model_type {model_type!r}; pass --target-modules")
    return list(LORA_TARGETS[model_type])


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft reads transformers' deprecated `is_gradient_checkpointing`; hide that FutureWarning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield


def wrap_lora(model: Any, model_type: str, *, r: int, alpha: int, dropout: float,
              targets: Sequence[str] | None = None) -> Any:
    """`model` with trainable LoRA adapters on the target modules (everything else frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type="CAUSAL_LM",
                        target_modules=lora_targets(model_type, targets), fan_in_fan_out=model_type == "gpt2")
    try:
        with _quiet_peft():
            return get_peft_model(model, config)
    except ValueError as err:   # e.g. target modules that the model does not have
        raise RFTError(f"LoRA: {str(err).splitlines()[0]}") from err


def merge_adapter(model: Any, adapter: str | os.PathLike) -> Any:
    """The base model with a saved peft adapter directory merged in."""
    from peft import PeftModel

    if not (Path(adapter) / "adapter_config.json").is_file():
        raise CheckpointError(f"{adapter}: not a peft adapter directory (no adapter_config.json)")
    with _quiet_peft():
        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def merge_to_hf(peft_model: Any, base_dir: str | os.PathLike, out_dir: Path, dtype: str = "auto") -> Path:
    """Merge the LoRA weights into the base and write a full HF directory (weights, config, tokenizer)."""
    name = source_dtype(read_hf_config(base_dir)) if dtype == "auto" else dtype
    # On the CPU: exact fp32 arithmetic (on Ampere+ the Trainer turned TF32 matmuls on for this process).
    merged = peft_model.to("cpu").merge_and_unload().to(DTYPES[name])
    merged.save_pretrained(str(out_dir))
    copy_tokenizer_files(base_dir, out_dir)
    return out_dir
