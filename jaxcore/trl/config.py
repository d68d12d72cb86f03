"""`GRPOConfig` with TRL 1.16's flat arguments, names and defaults, and its translation into jaxcore's composed job
config (`to_job_config`) with TRL's accounting of prompts, generations, steps per generation, epochs and steps.

    from jaxcore.trl import GRPOConfig, GRPOTrainer      # was: from trl import ...
    args = GRPOConfig(output_dir="out", learning_rate=1e-5, num_generations=8, max_completion_length=32)
"""

from __future__ import annotations

import math
import warnings

from jaxcore.grpo.config import GRPOConfig as JobConfig
from jaxcore.trl.arguments import HANDLED, IGNORED, REFUSED, TRL_DEFAULTS, optimizer_refusals
from jaxcore.trl.flat_arguments import NAME_OF_KEY, FlatArguments

TRL_NAME_OF_KEY = {           # a job-config key set from one TRL argument -> that argument (for error messages)
    **NAME_OF_KEY,
    **{f"grpo.{name}": name for name, target in HANDLED.items() if target == f"grpo.{name}"},
    **{f"grpo.{name}": name for name in ("gradient_accumulation_steps", "steps_per_generation", "num_iterations")},
}


class GRPOConfig(FlatArguments):
    """TRL 1.16's `trl.GRPOConfig`, keyword for keyword (transformers' TrainingArguments included): every argument
    is an attribute with TRL's default. An argument TRL does not have is TRL's TypeError; one that would change the
    numbers in a way jaxcore does not implement is a one-line ValueError; one with no effect in a JAX runtime is
    accepted with one warning naming what jaxcore does instead (`jaxcore.trl.arguments`)."""

    DEFAULTS, HANDLED, IGNORED, REFUSED, NAME_OF_KEY = TRL_DEFAULTS, HANDLED, IGNORED, REFUSED, TRL_NAME_OF_KEY

    def _check(self) -> None:
        """TRL's own checks and conversions."""
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        if self.auto_find_batch_size:
            raise ValueError("auto_find_batch_size is not supported by GRPO: the generation batch must hold whole "
                             "prompt groups of num_generations completions")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError("'generation_batch_size' and 'steps_per_generation' can not be both configured at the "
                             "same time")
        if self.num_generations < 2:
            raise ValueError(f"GRPO requires at least 2 generations per prompt to calculate the advantages. You "
                             f"provided {self.num_generations}, which is less than the minimum required.")

    def _probe(self) -> None:
        """The run counts devices later: any count whose batches hold whole groups will do here."""
        devices = (math.lcm(self.num_generations, self.num_generations_eval or self.num_generations)
                   if self.generation_batch_size is None else 1)
        generation_batch, _ = self.batch_accounting(devices)
        self.to_job_config(devices, train_rows=generation_batch // self.num_generations)

    def _refused_values(self) -> list[str]:
        return super()._refused_values() + optimizer_refusals(self)

    def batch_accounting(self, devices: int) -> tuple[int, int]:
        """TRL's (generation_batch_size, steps_per_generation) on `devices` data-parallel devices (TRL's world
        size): completions per generation and the micro-batches they are split into."""
        global_batch = self.per_device_train_batch_size * devices
        if self.generation_batch_size is None:
            steps = self.steps_per_generation or self.gradient_accumulation_steps
            generation_batch = global_batch * steps
        else:
            if self.generation_batch_size % global_batch:
                raise ValueError(f"generation_batch_size ({self.generation_batch_size}) must be divisible by the "
                                 f"global batch size ({global_batch}).")
            generation_batch, steps = self.generation_batch_size, self.generation_batch_size // global_batch
        if generation_batch % self.num_generations:
            raise ValueError(f"generation_batch_size ({generation_batch}) must be divisible by num_generations "
                             f"({self.num_generations}).")
        return generation_batch, steps

    def optimizer_steps(self, devices: int, train_rows: int | None) -> tuple[int, int]:
        """(TRL's max_steps, optimizer steps per dataset epoch) for a dataset of `train_rows` prompts: TRL's
        RepeatSampler and transformers' `set_initial_training_values`, counted in optimizer steps."""
        generation_batch, steps = self.batch_accounting(devices)
        prompts = generation_batch // self.num_generations
        per_epoch = 0
        if train_rows is not None:
            micro_batches = (train_rows // prompts) * self.num_iterations * steps      # the dataloader's length
            per_epoch = max(-(-micro_batches // self.gradient_accumulation_steps), 1)
            if train_rows < prompts:
                raise ValueError(f"train_dataset has {train_rows} rows, fewer than the {prompts} prompts of one "
                                 f"generation (generation_batch_size {generation_batch} / num_generations "
                                 f"{self.num_generations})")
        return self.run_steps(per_epoch, train_rows), per_epoch

    def to_job_config(self, devices: int = 1, train_rows: int | None = None) -> JobConfig:
        """jaxcore's job config for this run on `devices` data-parallel devices with `train_rows` prompts: one
        jaxcore epoch is one generation (rollout), trained in num_iterations x steps_per_generation /
        gradient_accumulation_steps optimizer steps. A run whose max_steps is not a multiple of that trains up to
        the end of its last generation (warned)."""
        generation_batch, steps = self.batch_accounting(devices)
        if steps % self.gradient_accumulation_steps:
            raise ValueError(f"steps_per_generation ({steps}) must be a multiple of gradient_accumulation_steps "
                             f"({self.gradient_accumulation_steps}) in jaxcore (each optimizer step takes whole "
                             "micro-batches of one generation)")
        total_steps, per_epoch = self.optimizer_steps(devices, train_rows)
        per_rollout = self.num_iterations * steps // self.gradient_accumulation_steps
        rollouts = -(-total_steps // per_rollout)
        if rollouts * per_rollout != total_steps:
            warnings.warn(f"max_steps {total_steps} is not a multiple of the {per_rollout} optimizer steps of one "
                          f"generation: jaxcore trains {rollouts * per_rollout} (whole generations)", UserWarning,
                          stacklevel=2)
        job = JobConfig()
        job.rollout.prompts_per_epoch = generation_batch // self.num_generations
        self._map_sampling(job)
        self._map_optimizer(job, rollouts * per_rollout, "adamw")
        self._map_train(job, rollouts, per_rollout, per_epoch, devices)
        job.model.remat = bool(self.activation_checkpointing)
        job.train.shuffle = bool(self.shuffle_dataset)
        self._map_grpo(job, steps)
        return self._validated(job)

    def _map_grpo(self, job: JobConfig, steps: int) -> None:
        g = job.grpo
        for name, target in HANDLED.items():
            if target == f"grpo.{name}":
                setattr(g, name, getattr(self, name))
        g.scale_rewards = self.scale_rewards
        g.num_iterations = self.num_iterations
        g.gradient_accumulation_steps = self.gradient_accumulation_steps
        g.steps_per_generation = steps
