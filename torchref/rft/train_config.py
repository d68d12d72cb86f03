"""The settings of LoRA SFT (`train.train`), in a module without torch so that `torchref rft-train`'s flags
can default to them."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from jaxcore.config.schema import check
from jaxcore.errors import ConfigValueError
from torchref.rft.errors import RFTError

SaveStrategy = Literal["no", "epoch", "steps"]
SAVE_STRATEGIES = typing.get_args(SaveStrategy)


@dataclasses.dataclass
class TrainConfig:
    """`rft-train`'s settings (its flags default to these); each field's range is declared on it and checked on
    construction (`jaxcore.config.schema`)."""

    model: str                                # HF model directory (base)
    data: str                                 # [question, answer, reasoning] JSON list
    out: str                                  # output directory
    epochs: Annotated[float, Gt(0)] = 3.0
    max_steps: int = -1                       # > 0 overrides epochs
    learning_rate: Annotated[float, Gt(0)] = 2e-4
    batch_size: Annotated[int, Ge(1)] = 16    # per device
    grad_accum: Annotated[int, Ge(1)] = 1
    warmup: Annotated[float, Ge(0)] = 0.05    # < 1: fraction of the steps; >= 1: steps
    weight_decay: Annotated[float, Ge(0)] = 0.0
    max_grad_norm: float = 1.0
    lora_r: Annotated[int, Ge(1)] = 16
    lora_alpha: Annotated[int, Ge(1)] = 32
    lora_dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.05
    target_modules: tuple[str, ...] | None = None   # None: LORA_TARGETS[model_type]
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = "auto"
    gradient_checkpointing: bool = False
    optim: str | None = None                  # None: adamw_torch_fused on CUDA, else adamw_torch
    dataloader_workers: Annotated[int, Ge(0)] | None = None   # None: 4 on CUDA, 0 on the CPU
    save_strategy: SaveStrategy = "epoch"
    save_steps: Annotated[int, Ge(1)] = 500
    save_total_limit: Annotated[int, Ge(1)] = 1
    logging_steps: Annotated[int, Ge(1)] = 10
    max_length: Annotated[int, Ge(1)] = 512
    seed: Annotated[int, Ge(0)] = 0
    template: str | None = None
    chat: str = "auto"
    system: str | None = None
    merge: bool = False
    merge_dtype: str = "auto"                 # auto: the base checkpoint's dtype
    report_to: str = "none"
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        try:
            check(self)
        except ConfigValueError as err:
            raise RFTError(str(err)) from None
        from torchref.rft.precision import DTYPES  # lazy: torch (the CLI reads these defaults without it)

        if self.merge_dtype != "auto" and self.merge_dtype not in DTYPES:
            raise RFTError(f"merge dtype must be auto or one of {', '.join(DTYPES)}, got {self.merge_dtype!r}")
        if self.warmup >= 1 and self.warmup != int(self.warmup):
            raise RFTError(f"warmup must be a fraction in [0, 1) or a whole number of steps, got {self.warmup}")
