"""The settings of LoRA SFT (`train.train`), in a module without torch so that `torchref rft-train`'s flags
can default to them."""

from __future__ import annotations

import dataclasses

from torchref.rft.errors import RFTError

SAVE_STRATEGIES = ("no", "epoch", "steps")


@dataclasses.dataclass
class TrainConfig:
    """`rft-train`'s settings (its flags default to these)."""

    model: str                                # HF model directory (base)
    data: str                                 # [question, answer, reasoning] JSON list
    out: str                                  # output directory
    epochs: float = 3.0
    max_steps: int = -1                       # > 0 overrides epochs
    learning_rate: float = 2e-4
    batch_size: int = 16                      # per device
    grad_accum: int = 1
    warmup: float = 0.05                      # < 1: fraction of the steps; >= 1: steps
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None   # None: LORA_TARGETS[model_type]
    mixed_precision: str = "auto"             # auto, no, fp16, bf16
    gradient_checkpointing: bool = False
    optim: str | None = None                  # None: adamw_torch_fused on CUDA, else adamw_torch
    dataloader_workers: int | None = None     # None: 4 on CUDA, 0 on the CPU
    save_strategy: str = "epoch"
    save_steps: int = 500
    save_total_limit: int = 1
    logging_steps: int = 10
    max_length: int = 512
    seed: int = 0
    template: str | None = None
    chat: str = "auto"
    system: str | None = None
    merge: bool = False
    merge_dtype: str = "auto"                 # auto: the base checkpoint's dtype
    report_to: str = "none"
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.save_strategy not in SAVE_STRATEGIES:
            raise RFTError(f"save strategy must be one of {', '.join(SAVE_STRATEGIES)}, got {self.save_strategy!r}")
        from torchref.rft.precision import DTYPES  # lazy: torch (the CLI reads these defaults without it)

        if self.merge_dtype != "auto" and self.merge_dtype not in DTYPES:
            raise RFTError(f"merge dtype must be auto or one of {', '.join(DTYPES)}, got {self.merge_dtype!r}")
        for name in ("batch_size", "grad_accum", "lora_r", "logging_steps", "max_length", "save_total_limit"):
            if getattr(self, name) < 1:
                raise RFTError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or (self.warmup >= 1 and self.warmup != int(self.warmup)):
            raise RFTError(f"warmup must be a fraction in [0, 1) or a whole number of steps, got {self.warmup}")
