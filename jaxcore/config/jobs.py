"""Config sections shared by the trainers (ES and GRPO), and the ES and GRPO job configs."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ModelSection:
    path: str = ""                      # HF directory or jaxcore checkpoint
    dtype: str = "float32"              # compute dtype; parameters stay float32
    remat: bool = False


@dataclasses.dataclass
class TaskSection:
    name: str = "addition"              # see jaxcore.rewards.registry.TASKS
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RolloutSection:
    prompts_per_epoch: int = 32
    generations_per_prompt: int = 1
    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    chat_template: bool = False
    system_prompt: str | None = None
    max_prompt_length: int | None = None  # prompt tokens kept (None: the model's positions)
    truncate_prompts: bool = True       # longer prompts: keep the last tokens (warned, counted) or refuse


@dataclasses.dataclass
class OptimizerSection:
    name: str = "sgd"                   # sgd | adam | adamw
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    momentum: float | None = None
    schedule: str = "constant"          # constant | cosine | linear
    warmup_steps: int = 0
    max_grad_norm: float | None = None  # GRPO only


@dataclasses.dataclass
class RewardSection:
    # Replace the task's rewards: "file.py:fn", "package.module:fn" (TRL's signature), "model:DIR" (a local
    # sequence-classification reward model) or a built-in name; weights default to 1.0 each.
    functions: list[str] = dataclasses.field(default_factory=list)
    weights: list[float] | None = None
    num_workers: int = 0                # >0: score in a process pool
    timeout_s: float = 30.0
    fallback: float = 0.0               # value given to samples whose reward function failed


@dataclasses.dataclass
class TrainSection:
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


@dataclasses.dataclass
class DistributedSection:
    coordinator: str | None = None      # "host:port": run jax.distributed.initialize
    num_processes: int = 1
    process_id: int = 0


@dataclasses.dataclass
class EsSection:
    population: int = 64
    rank: int = 1
    sigma: float = 0.01
    noise_reuse: int = 1
    shaping: str = "zscore"             # zscore | group_zscore | centered_rank | none
    non_matrix: str = "frozen"          # frozen | full
    include_embeddings: bool = False
    include_lm_head: bool = False
    master_dtype: str = "float32"       # float32 | bfloat16: the sharded master weights and optimizer state


@dataclasses.dataclass
class MeshSection:
    model: int = 1                      # devices that shard each compute weight; "pop" gets the rest
    device_memory: str = ""             # e.g. "40GB": checked against the memory plan (GPUs: read from the device)
    shard_min_size: int = 2**14         # master/optimizer-state leaves with fewer elements stay replicated


@dataclasses.dataclass
class ESConfig:
    """`jaxcore es` configuration."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    task: TaskSection = dataclasses.field(default_factory=TaskSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    es: EsSection = dataclasses.field(default_factory=EsSection)
    optimizer: OptimizerSection = dataclasses.field(default_factory=OptimizerSection)
    rewards: RewardSection = dataclasses.field(default_factory=RewardSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    distributed: DistributedSection = dataclasses.field(default_factory=DistributedSection)
    mesh: MeshSection = dataclasses.field(default_factory=MeshSection)


# ----------------------------------------------------------------------------- GRPO


@dataclasses.dataclass
class GRPOSection:
    """GRPO settings (TRL's GRPOConfig names; G is rollout.generations_per_prompt and TRL's
    max_completion_length is rollout.max_new_tokens)."""

    beta: float = 0.0                   # k3-KL coefficient; 0: no reference model is loaded
    use_bias_correction_kl: bool = True  # KL term times the importance ratio (TRL's default)
    epsilon: float = 0.2                # lower clip: ratio >= 1 - epsilon
    epsilon_high: float | None = None   # upper clip (None: epsilon); cispo: the ratio cap
    delta: float | None = None          # two-sided clipping: ratio <= delta in the unclipped branch
    loss_type: str = "dapo"             # grpo | bnpo | dr_grpo | dapo | cispo | sapo | luspo | vespo
    importance_sampling_level: str = "token"   # token | sequence (GSPO)
    top_entropy_quantile: float = 1.0   # policy loss only on the top-q entropy tokens
    entropy_coef: float = 0.0           # entropy bonus: loss -= entropy_coef * mean token entropy
    off_policy_mask_threshold: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    scale_rewards: str = "group"        # group | batch | none
    num_iterations: int = 1             # mu: passes over each rollout
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None   # micro-batches per rollout (None: gradient_accumulation_steps)
    mask_truncated_completions: bool = False
    ref_model_path: str | None = None   # beta > 0: reference model (default: a frozen copy of the initial policy)
    sync_ref_model: bool = False        # TR-DPO reference sync (needs beta != 0)
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512
    lora: LoRASection | None = None     # set to train LoRA adapters only (e.g. grpo.lora={rank: 8})
    fsdp: int = 1                       # size of the "fsdp" mesh axis (parameters sharded); the rest is "data"


@dataclasses.dataclass
class LoRASection:
    """peft's LoraConfig (r, lora_alpha, target_modules, lora_dropout) plus the frozen base's dtype."""

    rank: int = 8
    alpha: float = 8.0
    target_modules: list[str] = dataclasses.field(default_factory=lambda: ["q_proj", "v_proj"])
    dropout: float = 0.0
    base_dtype: str | None = None       # e.g. bfloat16: store the frozen base in bf16
    export: str = "both"                # merged (train.export_hf's final_hf) | adapter (final_adapter) | both


@dataclasses.dataclass
class GRPORolloutSection(RolloutSection):
    """Rollouts with GRPO's defaults: sampled (temperature 1), 8 completions per prompt."""

    prompts_per_epoch: int = 16
    generations_per_prompt: int = 8
    temperature: float = 1.0


@dataclasses.dataclass
class GRPOOptimizerSection(OptimizerSection):
    """AdamW with TRL's defaults (only adam/adamw are supported for GRPO); `schedule` is TRL's
    `lr_scheduler_type` (linear decay to 0 over the run by default, as in TRL)."""

    name: str = "adamw"
    learning_rate: float = 1e-6
    schedule: str = "linear"
    max_grad_norm: float | None = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8


@dataclasses.dataclass
class GRPOTrainSection(TrainSection):
    out_dir: str = "runs/grpo"


@dataclasses.dataclass
class GRPOConfig:
    """`jaxcore grpo` configuration."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    task: TaskSection = dataclasses.field(default_factory=TaskSection)
    rollout: GRPORolloutSection = dataclasses.field(default_factory=GRPORolloutSection)
    grpo: GRPOSection = dataclasses.field(default_factory=GRPOSection)
    optimizer: GRPOOptimizerSection = dataclasses.field(default_factory=GRPOOptimizerSection)
    rewards: RewardSection = dataclasses.field(default_factory=RewardSection)
    train: GRPOTrainSection = dataclasses.field(default_factory=GRPOTrainSection)
    distributed: DistributedSection = dataclasses.field(default_factory=DistributedSection)
