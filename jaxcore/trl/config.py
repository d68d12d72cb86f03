"""`GRPOConfig` with TRL 1.16's flat arguments, names and defaults, and its translation into jaxcore's composed job
config (`to_job_config`) with TRL's accounting of prompts, generations, steps per generation, epochs and steps.

    from jaxcore.trl import GRPOConfig, GRPOTrainer      # was: from trl import ...
    args = GRPOConfig(output_dir="out", learning_rate=1e-5, num_generations=8, max_completion_length=32)
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from typing import Any

from jaxcore.errors import ConfigValueError
from jaxcore.grpo.config import GRPOConfig as JobConfig
from jaxcore.trl.arguments import HANDLED, IGNORED, REFUSED, TRL_DEFAULTS

TRL_NAME_OF_KEY = {           # a job-config key set from one TRL argument -> that argument (for error messages)
    **{f"grpo.{name}": name for name, target in HANDLED.items() if target == f"grpo.{name}"},
    "rollout.temperature": "temperature", "rollout.top_p": "top_p", "rollout.top_k": "top_k", "rollout.min_p": "min_p",
    "rollout.repetition_penalty": "repetition_penalty",
    "rollout.generations_per_prompt": "num_generations", "rollout.max_new_tokens": "max_completion_length",
    "rollout.max_tool_calling_iterations": "max_tool_calling_iterations", "rewards.weights": "reward_weights",
    "optimizer.learning_rate": "learning_rate", "optimizer.weight_decay": "weight_decay",
    **{f"optimizer.{name}": name for name in ("adam_beta1", "adam_beta2", "adam_epsilon", "warmup_steps")},
    **{f"grpo.{name}": name for name in ("gradient_accumulation_steps", "steps_per_generation", "num_iterations")},
    "train.seed": "seed", "train.out_dir": "output_dir",
}
GENERATION_KWARGS = {         # a generation_kwargs key jaxcore follows -> the TRL argument it overrides, as in TRL
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_completion_length",
}
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
KEEP_EVERY_CHECKPOINT = 1_000_000           # save_total_limit=None: TRL keeps them all


class GRPOConfig:
    """TRL 1.16's `trl.GRPOConfig`, keyword for keyword (transformers' TrainingArguments included): every argument
    is an attribute with TRL's default. An argument TRL does not have is TRL's TypeError; one that would change the
    numbers in a way jaxcore does not implement is a one-line ValueError; one with no effect in a JAX runtime is
    accepted with one warning naming what jaxcore does instead (`jaxcore.trl.arguments`)."""

    def __init__(self, output_dir: str | None = None, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in TRL_DEFAULTS:
                raise TypeError(f"GRPOConfig.__init__() got an unexpected keyword argument '{name}'")
        values = {**copy.deepcopy(TRL_DEFAULTS), **kwargs, "output_dir": output_dir}
        self.__dict__.update(values)
        self._post_init(set(kwargs) | ({"output_dir"} if output_dir is not None else set()))

    def _post_init(self, given: set[str]) -> None:
        """TRL's own checks and conversions, then jaxcore's refusals and the one warning."""
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        for name in ("generation_kwargs", "chat_template_kwargs", "model_init_kwargs"):
            if isinstance(getattr(self, name), str):     # TRL's dict fields take JSON text (from a command line)
                setattr(self, name, json.loads(getattr(self, name)))
        if str(getattr(self.eval_strategy, "value", self.eval_strategy)) != "no":
            self.do_eval = True                     # transformers' TrainingArguments does the same
        if self.auto_find_batch_size:
            raise ValueError("auto_find_batch_size is not supported by GRPO: the generation batch must hold whole "
                             "prompt groups of num_generations completions")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError("'generation_batch_size' and 'steps_per_generation' can not be both configured at the "
                             "same time")
        if self.num_generations < 2:
            raise ValueError(f"GRPO requires at least 2 generations per prompt to calculate the advantages. You "
                             f"provided {self.num_generations}, which is less than the minimum required.")
        refused = [f"{name}={getattr(self, name)!r} ({why})" for name, why in REFUSED.items()
                   if name in given and getattr(self, name) != TRL_DEFAULTS[name]]
        refused += self._refused_values()
        if refused:
            raise ValueError("not supported by jaxcore: " + "; ".join(refused))
        with warnings.catch_warnings():             # every value in its range, now (the run counts devices later:
            warnings.simplefilter("ignore")         # any count whose batch holds whole groups will do here)
            devices = (math.lcm(self.num_generations, self.num_generations_eval or self.num_generations)
                       if self.generation_batch_size is None else 1)
            generation_batch, _ = self.batch_accounting(devices)
            self.to_job_config(devices, train_rows=generation_batch // self.num_generations)
        ignored = [f"{name} ({what})" for name, what in IGNORED.items()
                   if name in given and getattr(self, name) != TRL_DEFAULTS[name]]
        if ignored:
            warnings.warn("GRPOConfig arguments with no effect in jaxcore: " + "; ".join(ignored), UserWarning,
                          stacklevel=3)

    def _refused_values(self) -> list[str]:
        """Values of mapped arguments that jaxcore cannot follow."""
        refused = []
        if not str(self.optim).startswith("adamw"):
            refused.append(f"optim={self.optim!r} (jaxcore trains GRPO with AdamW: an adamw_* value)")
        if str(getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)) not in SCHEDULES:
            refused.append(f"lr_scheduler_type={self.lr_scheduler_type!r} (jaxcore has {', '.join(SCHEDULES)})")
        if not self.average_tokens_across_devices:
            refused.append("average_tokens_across_devices=False (jaxcore's loss is over the global batch)")
        if str(getattr(self.save_strategy, "value", self.save_strategy)) == "best":
            refused.append("save_strategy='best' (the last checkpoint is the result)")
        unknown = sorted(set(self.generation_kwargs or {}) - set(GENERATION_KWARGS) - {"do_sample"})
        if unknown or (self.generation_kwargs or {}).get("do_sample", True) is not True:
            refused.append(f"generation_kwargs={self.generation_kwargs!r} (jaxcore samples with "
                           f"{', '.join(GENERATION_KWARGS)}; do_sample must stay True)")
        return refused

    def generation_settings(self) -> dict[str, Any]:
        """The sampling arguments after generation_kwargs overrides them (TRL updates its generation config with
        generation_kwargs last), by their TRL names."""
        settings = {name: getattr(self, name) for name in GENERATION_KWARGS.values()}
        for key, value in (self.generation_kwargs or {}).items():
            if key in GENERATION_KWARGS:
                settings[GENERATION_KWARGS[key]] = value
        return settings

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.__dict__.items() if k in TRL_DEFAULTS and v != TRL_DEFAULTS[k]}
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def to_dict(self) -> dict[str, Any]:
        """Every argument and its value (transformers' `TrainingArguments.to_dict`)."""
        return {name: getattr(self, name) for name in TRL_DEFAULTS}

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
        if self.max_steps > 0:
            return self.max_steps, per_epoch
        if train_rows is None:
            raise ValueError("max_steps must be set when the train dataset's length is not known")
        return math.ceil(self.num_train_epochs * per_epoch), per_epoch

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
        self._map_rollout(job, generation_batch)
        self._map_optimizer(job, rollouts * per_rollout)
        self._map_train(job, rollouts, per_rollout, per_epoch, devices)
        self._map_grpo(job, steps)
        try:
            job.validate()
        except (ConfigValueError, ValueError) as err:
            message = str(err)
            for key in sorted(TRL_NAME_OF_KEY, key=len, reverse=True):
                message = message.replace(key, TRL_NAME_OF_KEY[key])
            raise ValueError(f"GRPOConfig: {message}") from None
        return job

    def _map_rollout(self, job: JobConfig, generation_batch: int) -> None:
        r = job.rollout
        r.prompts_per_epoch = generation_batch // self.num_generations
        r.generations_per_prompt = self.num_generations
        given = self.generation_settings()
        r.max_new_tokens = r.max_episode_tokens = given["max_completion_length"]
        r.temperature, r.top_p, r.top_k = given["temperature"], given["top_p"], given["top_k"]
        r.min_p = 0.0 if given["min_p"] is None else given["min_p"]
        r.repetition_penalty = given["repetition_penalty"]
        r.chat_template_kwargs = dict(self.chat_template_kwargs or {})
        r.max_tool_calling_iterations = self.max_tool_calling_iterations
        job.rewards.weights = None if self.reward_weights is None else [float(w) for w in self.reward_weights]

    def _map_optimizer(self, job: JobConfig, total_steps: int) -> None:
        o = job.optimizer
        o.name, o.learning_rate, o.weight_decay = "adamw", self.learning_rate, self.weight_decay
        o.schedule = SCHEDULES[str(getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type))]
        o.warmup_steps = (int(self.warmup_steps) if self.warmup_steps >= 1
                          else math.ceil(total_steps * self.warmup_steps))
        o.max_grad_norm = self.max_grad_norm
        o.adam_beta1, o.adam_beta2, o.adam_epsilon = self.adam_beta1, self.adam_beta2, self.adam_epsilon

    def _map_train(self, job: JobConfig, rollouts: int, per_rollout: int, per_epoch: int, devices: int) -> None:
        t = job.train
        t.epochs, t.seed, t.out_dir = rollouts, self.seed, str(self.output_dir)
        t.progress = not self.disable_tqdm
        t.log_completions, t.completions_to_print = bool(self.log_completions), self.num_completions_to_print
        reports = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])
        t.tensorboard = bool({"tensorboard", "all"} & set(reports))
        t.max_to_keep = KEEP_EVERY_CHECKPOINT if self.save_total_limit is None else max(self.save_total_limit, 1)
        t.checkpoint_every = self._every(self.save_strategy, self.save_steps, rollouts, per_rollout, per_epoch)
        eval_steps = self.eval_steps if self.eval_steps is not None else self.logging_steps
        t.eval_every = self._every(self.eval_strategy, eval_steps, rollouts, per_rollout, per_epoch)
        t.eval_batch_size = self.per_device_eval_batch_size * devices
        t.eval_samples_per_prompt = self.num_generations_eval or self.num_generations
        if self.do_eval and t.eval_every >= 0 and t.eval_batch_size % t.eval_samples_per_prompt:
            raise ValueError(f"The global eval batch size ({self.per_device_eval_batch_size} * {devices}) must be "
                             f"divisible by the number of generations used for evaluation "
                             f"({t.eval_samples_per_prompt}).")
        job.model.dtype = "bfloat16" if self.bf16 else "float32"
        job.model.remat = bool(self.gradient_checkpointing or self.activation_checkpointing)

    @staticmethod
    def _every(strategy: Any, steps: float, rollouts: int, per_rollout: int, per_epoch: int) -> int:
        """A TRL save/eval strategy as jaxcore's every-N-rollouts (-1: never)."""
        strategy = str(getattr(strategy, "value", strategy))
        if strategy == "no":
            return -1
        if strategy == "epoch":
            return max(per_epoch // per_rollout, 1)
        every_steps = steps if steps >= 1 else math.ceil(rollouts * per_rollout * steps)
        return max(int(every_steps) // per_rollout, 1)

    def _map_grpo(self, job: JobConfig, steps: int) -> None:
        g = job.grpo
        for name, target in HANDLED.items():
            if target == f"grpo.{name}":
                setattr(g, name, getattr(self, name))
        g.scale_rewards = self.scale_rewards
        g.num_iterations = self.num_iterations
        g.gradient_accumulation_steps = self.gradient_accumulation_steps
        g.steps_per_generation = steps
