"""What the current device supports: dtypes for inference, mixed precision and optimiser for training.

Only queries; nothing here moves tensors. Under `torchrun`/`accelerate launch` every process asks the
same questions about its own GPU, and the HF Trainer does the placement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchref.rft.errors import RFTError

MIXED_PRECISION = ("auto", "no", "fp16", "bf16")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cuda_bf16() -> bool:
    """A CUDA device with bf16 support (Ampere and newer)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def tf32_capable() -> bool:
    """TF32 matmuls exist on compute capability >= 8.0."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def inference_device() -> torch.device:
    """Where datagen and eval run (one process: the first GPU, else the CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inference_dtype(name: str = "auto") -> torch.dtype:
    """`auto`: bf16 on bf16 GPUs, fp16 on other GPUs, fp32 on the CPU."""
    if name != "auto":
        if name not in DTYPES:
            raise RFTError(f"unknown dtype {name!r}; use auto or {', '.join(DTYPES)}")
        return DTYPES[name]
    if cuda_bf16():
        return torch.bfloat16
    return torch.float16 if torch.cuda.is_available() else torch.float32


def mixed_precision(name: str = "auto") -> str:
    """Training precision, one of no/fp16/bf16: `auto` is bf16 where supported, fp16 on other GPUs, no on CPU."""
    if name not in MIXED_PRECISION:
        raise RFTError(f"unknown mixed precision {name!r}; use one of {', '.join(MIXED_PRECISION)}")
    if name == "auto":
        if cuda_bf16():
            return "bf16"
        return "fp16" if torch.cuda.is_available() else "no"
    if name == "fp16" and not torch.cuda.is_available():
        raise RFTError("--mixed-precision fp16 needs a CUDA GPU; use bf16 or no on the CPU")
    if name == "bf16" and torch.cuda.is_available() and not cuda_bf16():
        raise RFTError("this GPU has no bf16 support; use --mixed-precision fp16")
    return name


def default_optim() -> str:
    """The HF Trainer optimiser name: fused AdamW on CUDA, the plain torch AdamW elsewhere."""
    return "adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch"


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls without TF32 inside the block (the HF Trainer's tf32=True stays on for the process after)."""
    matmul = torch.backends.cuda.matmul
    name, exact = ("fp32_precision", "ieee") if hasattr(matmul, "fp32_precision") else ("allow_tf32", False)
    before = getattr(matmul, name)
    setattr(matmul, name, exact)
    try:
        yield
    finally:
        setattr(matmul, name, before)
