"""GRPO's settings, each declared once with TRL 1.16's name and default: the loss (`GRPOLossConfig`), the
job's `grpo:` section (`GRPOOptions`: the loss settings plus how a rollout is trained on), and the
`jaxcore grpo` job config (`GRPOConfig`) composed of those and of the runtime's sections, with TRL's
defaults where they differ from ES's. G is rollout.generations_per_prompt and TRL's max_completion_length
is rollout.completion_tokens (max_new_tokens; a multi-turn episode's max_episode_tokens)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Interval

from jaxcore.config.schema import check
from jaxcore.grpo.async_config import AsyncOptions
from jaxcore.grpo.loss_types import LOSS_KINDS
from jaxcore.model.lora import LoRAConfig
from jaxcore.parallel.config import DistributedConfig
from jaxcore.rewards.config import RewardsConfig, TaskConfig
from jaxcore.runtime.config import ModelSource, RolloutConfig, TrainConfig
from jaxcore.runtime.optim import OptimizerConfig

LossType = Literal[tuple(LOSS_KINDS)]           # one entry per type in jaxcore.grpo.loss_types
ImportanceSamplingLevel = Literal["token", "sequence"]
ScaleRewards = Literal["group", "batch", "none"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]
LOSS_TYPES = typing.get_args(LossType)
IS_LEVELS = typing.get_args(ImportanceSamplingLevel)
SCALES = typing.get_args(ScaleRewards)


@dataclasses.dataclass
class GRPOLossConfig:
    """The loss settings (names and defaults as in TRL 1.16's GRPOConfig; ranges checked on construction)."""

    beta: Annotated[float, Ge(0)] = 0.0     # k3-KL coefficient; 0: no reference model is loaded
    use_bias_correction_kl: bool = True     # per-token KL times the importance ratio (TRL's default)
    epsilon: Annotated[float, Ge(0)] = 0.2  # lower clip: ratio >= 1 - epsilon
    epsilon_high: Annotated[float, Ge(0)] | None = None   # upper clip 1 + epsilon_high (None: epsilon); cispo: cap
    delta: Annotated[float, Gt(0)] | None = None   # two-sided clipping: ratio <= delta (TRL: > 1 + epsilon)
    loss_type: LossType = "dapo"
    importance_sampling_level: ImportanceSamplingLevel = "token"   # sequence: GSPO, exp(mean log-ratio) per row
    top_entropy_quantile: Annotated[float, Interval(ge=0, le=1)] = 1.0   # policy loss on the top-q entropy tokens
    entropy_coef: float = 0.0               # loss -= entropy_coef * mean token entropy
    # TRL's adaptive controller: the coefficient (starting at entropy_coef) moves by entropy_coef_delta within
    # [entropy_coef_min, entropy_coef_max] after each optimiser step, up while the step's token entropy is at or
    # below entropy_target, down above it; the bonus applies only while the last step's entropy was at or below it
    use_adaptive_entropy: bool = False
    entropy_coef_min: Annotated[float, Ge(0)] = 0.0
    entropy_coef_max: Annotated[float, Ge(0)] = 1.0
    entropy_coef_delta: Annotated[float, Ge(0)] = 0.005
    entropy_target: float = 0.2
    off_policy_mask_threshold: float | None = None   # drop A < 0 rows whose mean (old - new) log-prob > this
    sapo_temperature_pos: Annotated[float, Gt(0)] = 1.0
    sapo_temperature_neg: Annotated[float, Gt(0)] = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigValueError for a setting outside its declared range (`jaxcore.config.schema`); a
        subclass adds the rules between its fields."""
        check(self)


LOSS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOLossConfig)}


class _WithLossDefaults:
    """A duck-typed loss config read with TRL's defaults (`GRPOLossConfig`'s) for the loss settings it lacks."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._cfg, name)
        except AttributeError:
            if name in LOSS_DEFAULTS:
                return LOSS_DEFAULTS[name]
            raise


def loss_settings(cfg: Any) -> Any:
    """`cfg` with every loss setting: a `GRPOLossConfig` as is; any other object with the loss settings' names
    (e.g. TRL's flat config, as parity_tests check) read with TRL's default for each one it lacks. The loss
    (`jaxcore.grpo.loss`) reads its config through this and hands it on to the loss type's term."""
    return cfg if isinstance(cfg, GRPOLossConfig | _WithLossDefaults) else _WithLossDefaults(cfg)


@dataclasses.dataclass
class GRPOOptions(GRPOLossConfig):
    """The job's `grpo:` section: the loss settings, plus rewards scaling, passes and micro-batches per
    rollout, the reference model, LoRA and the fsdp mesh axis."""

    scale_rewards: ScaleRewards = "group"
    # sum_then_normalize: advantages of the weighted sum (scale_rewards applies); normalize_then_sum: each
    # function's rewards normalized in its group, then the weighted sum normalized over the batch (TRL's GDPO)
    multi_objective_aggregation: Aggregation = "sum_then_normalize"
    num_iterations: Annotated[int, Ge(1)] = 1     # mu: passes over each rollout
    gradient_accumulation_steps: Annotated[int, Ge(1)] = 1
    steps_per_generation: Annotated[int, Ge(1)] | None = None   # micro-batches per rollout (None: the above)
    asynchronous: AsyncOptions | None = None   # generation on its own devices, overlapping training (issue 53)
    mask_truncated_completions: bool = False
    ref_model_path: str | None = None       # beta > 0: reference model (default: a frozen copy of the initial policy)
    sync_ref_model: bool = False            # TR-DPO: every ref_model_sync_steps, ref = a * policy + (1 - a) * ref
    ref_model_mixup_alpha: Annotated[float, Interval(ge=0, le=1)] = 0.6
    ref_model_sync_steps: Annotated[int, Ge(1)] = 512
    lora: LoRAConfig | None = None          # set to train LoRA adapters only (e.g. grpo.lora={rank: 8})
    fsdp: Annotated[int, Ge(1)] = 1         # size of the "fsdp" mesh axis (parameters sharded); the rest is "data"
    # unique-token training (`jaxcore.grpo.packing`): a prompt's completions attend to one copy of it
    share_prompts: bool = True
    # TRL AsyncGRPO's token_budget: slots per packed row, shared tokens counted once; completions fill rows at their
    # real lengths (None: a tree of a prompt and its completions per row, at the bucket widths)
    token_budget: Annotated[int, Ge(1)] | None = None

    def validate(self) -> None:
        super().validate()
        if self.generation_steps % self.gradient_accumulation_steps:
            raise ValueError(f"steps_per_generation={self.generation_steps} must be a multiple of "
                             f"gradient_accumulation_steps={self.gradient_accumulation_steps}")
        if self.sync_ref_model and self.beta == 0.0:
            raise ValueError("sync_ref_model needs beta != 0 (with beta = 0 there is no reference model)")
        if self.sync_ref_model and self.lora is not None:
            raise ValueError("sync_ref_model is not supported with LoRA (the reference is the frozen base)")

    @property
    def generation_steps(self) -> int:
        """TRL's steps_per_generation: micro-batches one rollout is split into."""
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def packs(self) -> bool:
        """Whether train steps and scoring forwards run packed prefix trees (`jaxcore.grpo.packing`)."""
        return self.share_prompts or self.token_budget is not None

    @property
    def steps_per_rollout(self) -> int:
        """Optimiser steps per pass over one rollout."""
        return self.generation_steps // self.gradient_accumulation_steps

    @property
    def needs_old_logp(self) -> bool:
        """Whether some optimiser step sees a policy other than the sampling one (then TRL stores old
        log-probs; otherwise the ratio is exactly 1 and none are needed)."""
        return self.num_iterations > 1 or self.steps_per_rollout > 1


def _grpo_rollout() -> RolloutConfig:
    return RolloutConfig(prompts_per_epoch=16, generations_per_prompt=8, temperature=1.0)


def _trl_optimizer() -> OptimizerConfig:
    return OptimizerConfig(name="adamw", learning_rate=1e-6, schedule="linear", max_grad_norm=1.0)


def _grpo_train() -> TrainConfig:
    return TrainConfig(out_dir="runs/grpo")


@dataclasses.dataclass
class GRPOConfig:
    """`jaxcore grpo` configuration (rollouts sampled at temperature 1, 8 completions per prompt; AdamW
    with TRL's defaults, linear decay to 0 over the run; only adam/adamw train GRPO)."""

    model: ModelSource = dataclasses.field(default_factory=ModelSource)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=_grpo_rollout)
    grpo: GRPOOptions = dataclasses.field(default_factory=GRPOOptions)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=_trl_optimizer)
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)
    train: TrainConfig = dataclasses.field(default_factory=_grpo_train)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigValueError for a value outside its range, ValueError for settings GRPO cannot use
        together (checked on construction and again by the trainer, after any edits)."""
        check(self)
        self.grpo.validate()
        if self.optimizer.name not in ("adam", "adamw"):
            raise ValueError(f"optimizer.name={self.optimizer.name}: GRPO trains with AdamW (set optimizer.name=adamw)")
        if self.rollout.temperature <= 0:
            raise ValueError("rollout.temperature must be > 0 for GRPO (greedy completions of a prompt are identical)")
        if self.rollout.generations_per_prompt < 2:
            raise ValueError("rollout.generations_per_prompt must be >= 2 for GRPO (advantages are relative to a "
                             "group)")

    @property
    def total_steps(self) -> int:
        """Optimiser steps of the whole run: the horizon of a decaying learning-rate schedule."""
        return self.train.epochs * self.grpo.num_iterations * self.grpo.steps_per_rollout

    @property
    def old_logp_source(self) -> str:
        """Where the old log-probs come from: "none" (not needed: the ratio is 1), "rollout" (the sampler's
        own: equal to the training forward only at temperature 1 in float32) or "forward" (the learner's
        temperature-scaled forward, as TRL recomputes them). In bfloat16 the decode path's log-probs differ
        from the training forward's by up to ~0.03, so a first pass would not see a ratio of 1 (GSPO's tiny
        epsilon would clip almost every row): any compute dtype but float32 uses the forward."""
        if not self.grpo.needs_old_logp:
            return "none"
        return "rollout" if self.rollout.temperature == 1.0 and self.model.dtype == "float32" else "forward"
