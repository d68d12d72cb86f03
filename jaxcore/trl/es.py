"""EGGROLL evolution strategies with TRL-style flat arguments: `ESConfig` takes transformers' TrainingArguments and
TRL's generation arguments where they mean what they mean for GRPO (output_dir, max_steps, num_train_epochs,
learning_rate, save/eval strategies, num_generations, max_completion_length, temperature, ...), and ES's own
settings by name (population_size, prompts_per_step, sigma, ...); `ESTrainer` is `jaxcore.trl.GRPOTrainer`'s
surface over jaxcore's ES trainer. One ES step is one update: one jaxcore epoch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jaxcore.api import ESTrainer as JobESTrainer
from jaxcore.es.config import ESConfig as JobConfig
from jaxcore.trl.arguments import HANDLED as GRPO_HANDLED
from jaxcore.trl.arguments import IGNORED as GRPO_IGNORED
from jaxcore.trl.arguments import REFUSED as GRPO_REFUSED
from jaxcore.trl.arguments import TRL_DEFAULTS
from jaxcore.trl.flat_arguments import NAME_OF_KEY, FlatArguments
from jaxcore.trl.trainer import Trainer

_JOB = JobConfig()
TRAINING_ARGUMENTS = list(TRL_DEFAULTS)[:list(TRL_DEFAULTS).index("model_init_kwargs")]   # transformers' own
GENERATION = ("num_generations", "num_generations_eval", "max_completion_length", "temperature", "top_p", "top_k",
              "min_p", "generation_kwargs", "chat_template_kwargs", "repetition_penalty", "max_tool_calling_iterations",
              "reward_weights", "log_completions", "num_completions_to_print")
EGGROLL_SETTINGS = ("rank", "sigma", "noise_reuse", "shaping", "non_matrix", "include_embeddings", "include_lm_head",
                    "master_dtype")      # es.* settings taken by their own names
ES_OWN = {                    # ES's own argument -> (its default, where it goes)
    "population_size": (_JOB.es.population, "es.population (members, an even number)"),
    "prompts_per_step": (_JOB.rollout.prompts_per_epoch, "rollout.prompts_per_epoch (every member answers each)"),
    **{name: (getattr(_JOB.es, name), f"es.{name}") for name in EGGROLL_SETTINGS},
    "momentum": (_JOB.optimizer.momentum, "optimizer.momentum (optim='sgd')"),
}
ES_DEFAULTS: dict[str, Any] = {
    **{name: TRL_DEFAULTS[name] for name in (*TRAINING_ARGUMENTS, *GENERATION)},
    # ES's defaults where a generic argument has one: SGD at a constant rate, greedy rollouts, short completions
    "learning_rate": _JOB.optimizer.learning_rate, "optim": "sgd", "lr_scheduler_type": "constant",
    "max_grad_norm": None, "bf16": False, "gradient_checkpointing": False, "num_generations": 1,
    "temperature": _JOB.rollout.temperature, "max_completion_length": _JOB.rollout.max_new_tokens,
    **{name: default for name, (default, _) in ES_OWN.items()},
}
_NOT_ES = "an ES step evaluates population_size members on prompts_per_step prompts and updates once"
_NO_GRADIENTS = "ES computes no gradients"
ES_HANDLED: dict[str, str] = {
    **{name: GRPO_HANDLED[name] for name in (
        "output_dir", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1",
        "adam_beta2", "adam_epsilon", "seed", "disable_tqdm", "report_to", "save_total_limit", "bf16",
        "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "max_tool_calling_iterations", "reward_weights", "generation_kwargs", "chat_template_kwargs",
        "log_completions", "num_completions_to_print", "num_generations_eval", "per_device_eval_batch_size")},
    "max_steps": "train.epochs (one ES step is one update)",
    "num_train_epochs": "train.epochs = ceil(num_train_epochs x rows / prompts_per_step)",
    "optim": "optimizer.name (sgd, or adamw for any adamw_* value)",
    "max_grad_norm": "optimizer.max_grad_norm (None: no clipping)",
    "save_strategy": "train.checkpoint_every (no: -1; steps: save_steps; epoch: once per dataset epoch)",
    "save_steps": "train.checkpoint_every = save_steps",
    "eval_strategy": "train.eval_every (no: -1; steps: eval_steps; epoch: once per dataset epoch)",
    "eval_steps": "train.eval_every = eval_steps (None: logging_steps)",
    "num_generations": "rollout.generations_per_prompt (completions per prompt and member)",
    **{name: where for name, (_, where) in ES_OWN.items()},
}
ES_REFUSED = {name: why for name, why in GRPO_REFUSED.items() if name in TRAINING_ARGUMENTS}
ES_IGNORED: dict[str, str] = {
    name: GRPO_IGNORED.get(name, {"per_device_train_batch_size": _NOT_ES, "gradient_accumulation_steps": _NOT_ES,
                                  "average_tokens_across_devices": _NOT_ES, "auto_find_batch_size": _NOT_ES,
                                  "gradient_checkpointing": _NO_GRADIENTS,
                                  "activation_checkpointing": _NO_GRADIENTS}.get(name, _NOT_ES))
    for name in ES_DEFAULTS if name not in ES_HANDLED and name not in ES_REFUSED}
ES_NAME_OF_KEY = {**NAME_OF_KEY, "es.population": "population_size", "rollout.prompts_per_epoch": "prompts_per_step",
                  **{f"es.{name}": name for name in EGGROLL_SETTINGS}}


class ESConfig(FlatArguments):
    """EGGROLL's job with TRL-style flat arguments (`jaxcore.trl.es`): the generic ones by TRL's names (ES's
    defaults where ES has its own: SGD at 1e-3, constant, greedy rollouts), ES's by their names."""

    DEFAULTS, HANDLED, IGNORED, REFUSED, NAME_OF_KEY = ES_DEFAULTS, ES_HANDLED, ES_IGNORED, ES_REFUSED, ES_NAME_OF_KEY

    def _probe(self) -> None:
        self.to_job_config(devices=1, train_rows=self.prompts_per_step)

    def _refused_values(self) -> list[str]:
        refused = super()._refused_values()
        if self.optim != "sgd" and not str(self.optim).startswith("adamw"):
            refused.append(f"optim={self.optim!r} (jaxcore's ES updates with sgd or adamw)")
        if self.momentum is not None and self.optim != "sgd":
            refused.append(f"momentum={self.momentum} with optim={self.optim!r} (only sgd takes a momentum; "
                           "adamw's are adam_beta1 and adam_beta2)")
        return refused

    def steps(self, train_rows: int | None) -> tuple[int, int]:
        """(ES steps of the run, ES steps per pass over `train_rows` prompts)."""
        per_epoch = max((train_rows or 0) // self.prompts_per_step, 1)
        return self.run_steps(per_epoch, train_rows), per_epoch

    def to_job_config(self, devices: int = 1, train_rows: int | None = None) -> JobConfig:
        """jaxcore's ES job config for a run on `devices` devices with `train_rows` prompts."""
        total, per_epoch = self.steps(train_rows)
        job = JobConfig()
        job.rollout.prompts_per_epoch = self.prompts_per_step
        self._map_sampling(job)
        self._map_optimizer(job, total, "sgd" if self.optim == "sgd" else "adamw")
        job.optimizer.momentum = self.momentum
        self._map_train(job, total, 1, per_epoch, devices)
        job.es.population = self.population_size
        for name in EGGROLL_SETTINGS:
            setattr(job.es, name, getattr(self, name))
        return self._validated(job)


class ESTrainer(Trainer):
    """jaxcore.trl's trainer surface (`train`, `evaluate`, `save_model`, `state`, `callbacks`) for EGGROLL, with
    `jaxcore.trl.GRPOTrainer`'s arguments where they mean the same thing."""

    args_type, job_trainer_type = ESConfig, JobESTrainer
    memory_settings = ("lower population_size or prompts_per_step (the rows generated at once), "
                       "max_completion_length, or set master_dtype='bfloat16'")

    def __init__(self, model: Any, reward_funcs: Any = None, args: ESConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, callbacks: Sequence[Any] | None = None,
                 tools: Sequence[Callable[..., Any]] | None = None, environment_factory: Any = None) -> None:
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, callbacks,
                         tools=tools, environment_factory=environment_factory)

    def _steps(self, job: Any, devices: int) -> tuple[int, int]:
        return 1, self.args.steps(self.train_rows)[1]
