"""The reference forward: the HF transformers model itself, run on the same inputs as jaxcore."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch


def load_reference(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Any:
    """`AutoModelForCausalLM` from a local directory, in eval mode, on the CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return model.eval()


def hf_position_ids(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """Left-padding-aware positions, as HF generate computes them (cumsum - 1, pads set to 1)."""
    positions = attention_mask_BT.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask_BT == 0, 1)


def reference_logits(model: Any, input_ids_BT: np.ndarray, attention_mask_BT: np.ndarray) -> np.ndarray:
    """Float32 numpy logits [B, T, V] of the HF model on a (left-padded) batch."""
    ids = torch.as_tensor(np.asarray(input_ids_BT), dtype=torch.long)
    mask = torch.as_tensor(np.asarray(attention_mask_BT), dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=hf_position_ids(mask))
    return out.logits.float().numpy()
