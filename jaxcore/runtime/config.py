"""The settings the training loop itself reads: which model to load, how rollouts are drawn, and the run's
length, evaluation, checkpoints and logging. Each is declared once here; the ES and GRPO job configs
(`jaxcore.es.config`, `jaxcore.grpo.config`) are composed of these and of their own sections."""

from __future__ import annotations

import dataclasses

from jaxcore.inference.sampling import SamplingConfig


@dataclasses.dataclass
class ModelSource:
    """The `model:` section: the weights a run starts from."""

    path: str = ""                      # HF directory or jaxcore checkpoint
    dtype: str = "float32"              # compute dtype; parameters stay float32
    remat: bool = False


@dataclasses.dataclass
class PromptLimitConfig:
    """How long a prompt may be (`hf.tokenization.rollout_prompt_limit`): the rollout's prompt limits, also
    those of torchref's RFT engines."""

    max_prompt_length: int | None = None  # prompt tokens kept (None: the model's positions)
    truncate_prompts: bool = True       # longer prompts: keep the last tokens (warned, counted) or refuse


@dataclasses.dataclass
class RolloutConfig(SamplingConfig, PromptLimitConfig):
    """The `rollout:` section: the sampling settings (temperature, top_k, top_p, min_p), prompts per epoch,
    completions per prompt and prompt limits (max_prompt_length, truncate_prompts). ES rolls out greedily by
    default, GRPO at temperature 1."""

    prompts_per_epoch: int = 32
    generations_per_prompt: int = 1
    max_new_tokens: int = 16
    chat_template: bool = False
    system_prompt: str | None = None


@dataclasses.dataclass
class TrainConfig:
    """The `train:` section: the run's length, evaluation, checkpoints, logging and output directory."""

    epochs: int = 10
    seed: int = 0
    out_dir: str = "runs/es"
    eval_every: int = 5                 # held-out evaluation every N epochs; 0 = only after the last, -1 = never
    eval_prompts: int = 64
    eval_batch_size: int = 256
    checkpoint_every: int = 5           # 0 = only at the end / on SIGTERM
    max_to_keep: int = 3
    max_bad_steps: int = 3              # consecutive NaN/Inf steps before stopping
    export_hf: bool = True              # write out_dir/final_hf at the end
    tensorboard: bool = True
    progress: bool = True
