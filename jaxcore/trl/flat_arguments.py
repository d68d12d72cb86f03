"""What TRL-style flat arguments have in common whatever the trainer (`jaxcore.trl.config.GRPOConfig`,
`jaxcore.trl.es.ESConfig`): keyword arguments checked against a table of names and defaults, each mapped, accepted
with one warning or refused in one line, and the mapping of the generic ones (transformers' TrainingArguments and
TRL's generation settings) onto a jaxcore job config's sections."""

from __future__ import annotations

import copy
import json
import logging
import math
import numbers
import warnings
from typing import Any, ClassVar

from jaxcore.config import schema
from jaxcore.errors import ConfigValueError

GENERATION_KWARGS = {         # a generation_kwargs key jaxcore follows -> the TRL argument it overrides, as in TRL
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_completion_length",
}
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
KEEP_EVERY_CHECKPOINT = 1_000_000           # save_total_limit None or <= 0: transformers keeps them all
REPORTS = ("tensorboard", "all", "none")    # report_to values jaxcore follows (all: TensorBoard, the one it has)
# Counts a run sizes its batches with or divides by: each an integer >= 1 where the trainer maps it (None: unset,
# where TRL's default is None); before, 0 was a bare ZeroDivisionError from the accounting
COUNTS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "num_iterations",
          "steps_per_generation", "generation_batch_size", "num_generations", "num_generations_eval",
          "max_completion_length", "population_size", "prompts_per_step")
# Numeric lists: each entry a real number (before, ['a'] was "could not convert string to float", naming nothing)
NUMBER_LISTS = ("reward_weights",)
# transformers' save/eval/logging intervals: > 0 under the 'steps' strategy, an integer when above 1
INTERVALS = {"logging_steps": "logging_strategy", "eval_steps": "eval_strategy", "save_steps": "save_strategy"}
NAME_OF_KEY = {               # a job-config key set from one generic argument -> that argument (for error messages)
    "rollout.temperature": "temperature", "rollout.top_p": "top_p", "rollout.top_k": "top_k", "rollout.min_p": "min_p",
    "rollout.repetition_penalty": "repetition_penalty",
    "rollout.generations_per_prompt": "num_generations", "rollout.max_new_tokens": "max_completion_length",
    "rollout.max_tool_calling_iterations": "max_tool_calling_iterations", "rewards.weights": "reward_weights",
    "optimizer.learning_rate": "learning_rate", "optimizer.weight_decay": "weight_decay",
    **{f"optimizer.{name}": name for name in ("adam_beta1", "adam_beta2", "adam_epsilon", "warmup_steps")},
    "train.seed": "seed", "train.out_dir": "output_dir",
}


def strategy(value: Any) -> str:
    """A transformers strategy (an enum or its string) as its string."""
    return str(getattr(value, "value", value))


class FlatArguments:
    """Flat keyword arguments with a table's names and defaults (`DEFAULTS`): an unknown name is TRL's TypeError; a
    name in `REFUSED` set to another value, or a value `_refused_values` names, is one ValueError line; a name in
    `IGNORED` set to another value gets one warning naming what jaxcore does instead."""

    DEFAULTS: ClassVar[dict[str, Any]]
    HANDLED: ClassVar[dict[str, str]]
    IGNORED: ClassVar[dict[str, str]]
    REFUSED: ClassVar[dict[str, str]]
    NAME_OF_KEY: ClassVar[dict[str, str]] = NAME_OF_KEY

    def __init__(self, output_dir: str | None = None, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in self.DEFAULTS:
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument '{name}'")
        self.__dict__.update({**copy.deepcopy(self.DEFAULTS), **kwargs, "output_dir": output_dir})
        given = set(kwargs) | ({"output_dir"} if output_dir is not None else set())
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        for name in ("generation_kwargs", "chat_template_kwargs", "model_init_kwargs"):
            if isinstance(getattr(self, name, None), str):   # TRL's dict fields take JSON text (from a command line)
                setattr(self, name, json.loads(getattr(self, name)))
        if strategy(self.eval_strategy) != "no":
            self.do_eval = True                     # transformers' TrainingArguments does the same
        self._resolve()
        self._check_training_arguments()
        self._check()
        refused = [f"{name}={getattr(self, name)!r} ({why})" for name, why in self.REFUSED.items()
                   if name in given and getattr(self, name) != self.DEFAULTS[name]]
        refused += self._refused_values()
        if refused:
            raise ValueError("not supported by jaxcore: " + "; ".join(refused))
        with warnings.catch_warnings():             # every value in its range, now
            warnings.simplefilter("ignore")
            self._probe()
        ignored = [f"{name} ({what})" for name, what in self.IGNORED.items()
                   if name in given and getattr(self, name) != self.DEFAULTS[name]]
        ignored += self._ignored_values()
        if ignored:
            warnings.warn(f"{type(self).__name__} arguments with no effect in jaxcore: " + "; ".join(ignored),
                          UserWarning, stacklevel=2)

    def _resolve(self) -> None:
        """What TRL's base config and transformers' TrainingArguments resolve in their __post_init__: the job
        follows the arguments as TRL resolves them, not their raw defaults."""
        if self.bf16 is None:                       # TRL: bf16 mixed precision unless fp16
            self.bf16 = not self.fp16
        if self.activation_checkpointing is None:   # transformers: the old name stands in for the new one
            self.activation_checkpointing = bool(self.gradient_checkpointing)
        self.gradient_checkpointing = self.activation_checkpointing
        if self.disable_tqdm is None:               # transformers: no bar when its logger is quieter than WARNING
            self.disable_tqdm = logging.getLogger("transformers.training_args").getEffectiveLevel() > logging.WARN

    def _check_training_arguments(self) -> None:
        """transformers' checks of arguments jaxcore derives settings from (its message for warmup_steps), so that
        an error names the value given rather than one derived from it (warmup_steps=-1 was reported as -3,
        max_steps=2.5 as train.epochs=3.0)."""
        if self.warmup_steps < 0:
            raise ValueError(f"Got warmup_steps = {self.warmup_steps}, Expected value warmup_steps >= 0")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int):
            raise ValueError(f"max_steps={self.max_steps!r}: must be an integer (a number of optimizer steps)")
        for name in COUNTS:
            value = getattr(self, name, None)
            if name in self.HANDLED and (value is not None or self.DEFAULTS[name] is not None) and not (
                    isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        for name in NUMBER_LISTS:
            value = getattr(self, name, None)
            entries = None if isinstance(value, (str, bytes)) else _entries(value)
            if name in self.HANDLED and value is not None and (entries is None or not all(
                    isinstance(v, numbers.Real) and not isinstance(v, bool) for v in entries)):
                raise ValueError(f"{name}={value!r}: must be a list of numbers")
        for name, strategy_name in INTERVALS.items():
            value = getattr(self, name)
            if strategy(getattr(self, strategy_name)) != "steps" or (name == "eval_steps" and not value):
                continue                            # transformers: eval_steps None or 0 falls back to logging_steps
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"{name}={value!r}: {strategy_name}='steps' requires a number of steps > 0 (or a "
                                 "fraction of the run below 1)")
            if value > 1 and value != int(value):
                raise ValueError(f"--{name} must be an integer if bigger than 1: {value}")      # transformers' own

    def _check(self) -> None:
        """The trainer's own checks of its arguments (TRL's), before jaxcore's refusals."""

    def _probe(self) -> None:
        """Build a job config once, so that every value is checked at construction."""

    def reports(self) -> list[str]:
        """report_to as a list of integration names."""
        return [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])

    def _ignored_values(self) -> list[str]:
        """Values of mapped arguments without effect in jaxcore: report_to's integrations other than TensorBoard."""
        others = [name for name in self.reports() if name not in REPORTS]
        return [f"report_to={others!r} (jaxcore logs to out_dir/metrics.jsonl, and to TensorBoard with 'tensorboard' "
                "or 'all')"] if others else []

    def _refused_values(self) -> list[str]:
        """Values of mapped arguments that jaxcore cannot follow."""
        refused = []
        if strategy(self.lr_scheduler_type) not in SCHEDULES:
            refused.append(f"lr_scheduler_type={self.lr_scheduler_type!r} (jaxcore has {', '.join(SCHEDULES)})")
        if strategy(self.save_strategy) == "best":
            refused.append("save_strategy='best' (the last checkpoint is the result)")
        unknown = sorted(set(self.generation_kwargs or {}) - set(GENERATION_KWARGS) - {"do_sample"})
        if unknown or (self.generation_kwargs or {}).get("do_sample", True) is not True:
            refused.append(f"generation_kwargs={self.generation_kwargs!r} (jaxcore samples with "
                           f"{', '.join(GENERATION_KWARGS)}; do_sample must stay True)")
        return refused

    def run_steps(self, per_epoch: int, train_rows: int | None) -> int:
        """transformers' step count: max_steps, or num_train_epochs passes of `per_epoch` steps over the dataset."""
        if self.max_steps > 0:
            return self.max_steps
        if train_rows is None:
            raise ValueError("max_steps must be set when the train dataset's length is not known")
        return math.ceil(self.num_train_epochs * per_epoch)

    def generation_settings(self) -> dict[str, Any]:
        """The sampling arguments after generation_kwargs overrides them (TRL updates its generation config with
        generation_kwargs last), by their TRL names."""
        settings = {name: getattr(self, name) for name in GENERATION_KWARGS.values()}
        for key, value in (self.generation_kwargs or {}).items():
            if key in GENERATION_KWARGS:
                settings[GENERATION_KWARGS[key]] = value
        return settings

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.__dict__.items() if k in self.DEFAULTS and v != self.DEFAULTS[k]}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def to_dict(self) -> dict[str, Any]:
        """Every argument and its value (transformers' `TrainingArguments.to_dict`)."""
        return {name: getattr(self, name) for name in self.DEFAULTS}

    # -- the generic arguments' mapping ---------------------------------------------------------------

    def _map_sampling(self, job: Any) -> None:
        """Generations per prompt, completion length, sampling, chat-template variables, reward weights."""
        r = job.rollout
        r.generations_per_prompt = self.num_generations
        given = self.generation_settings()
        r.max_new_tokens = r.max_episode_tokens = given["max_completion_length"]
        r.temperature, r.top_p, r.top_k = given["temperature"], given["top_p"], given["top_k"]
        r.min_p = 0.0 if given["min_p"] is None else given["min_p"]
        r.repetition_penalty = given["repetition_penalty"]
        r.chat_template_kwargs = dict(self.chat_template_kwargs or {})
        r.max_tool_calling_iterations = self.max_tool_calling_iterations
        job.rewards.weights = None if self.reward_weights is None else [float(w) for w in self.reward_weights]

    def _map_optimizer(self, job: Any, total_steps: int, name: str) -> None:
        o = job.optimizer
        o.name, o.learning_rate, o.weight_decay = name, self.learning_rate, self.weight_decay
        o.schedule = SCHEDULES[strategy(self.lr_scheduler_type)]
        o.warmup_steps = (int(self.warmup_steps) if self.warmup_steps >= 1
                          else math.ceil(total_steps * self.warmup_steps))
        o.max_grad_norm = self.max_grad_norm
        o.adam_beta1, o.adam_beta2, o.adam_epsilon = self.adam_beta1, self.adam_beta2, self.adam_epsilon

    def _map_train(self, job: Any, rollouts: int, per_rollout: int, per_epoch: int, devices: int) -> None:
        """The run's length, seed, output, logging, checkpoints and evaluation: `rollouts` jaxcore epochs of
        `per_rollout` optimizer steps each, `per_epoch` optimizer steps per pass over the dataset."""
        t = job.train
        t.epochs, t.seed, t.out_dir = rollouts, self.seed, str(self.output_dir)
        t.progress = not self.disable_tqdm
        t.log_completions, t.completions_to_print = bool(self.log_completions), self.num_completions_to_print
        t.tensorboard = bool({"tensorboard", "all"} & set(self.reports()))
        limit = self.save_total_limit           # transformers' rotate_checkpoints deletes none for None or <= 0
        t.max_to_keep = KEEP_EVERY_CHECKPOINT if limit is None or limit <= 0 else limit
        t.checkpoint_every = every(self.save_strategy, self.save_steps, rollouts, per_rollout, per_epoch)
        eval_steps = self.eval_steps or self.logging_steps       # transformers: None or 0 is logging_steps
        t.eval_every = every(self.eval_strategy, eval_steps, rollouts, per_rollout, per_epoch)
        t.eval_batch_size = self.per_device_eval_batch_size * devices
        t.eval_samples_per_prompt = self.num_generations_eval or self.num_generations
        if self.do_eval and t.eval_every >= 0 and t.eval_batch_size % t.eval_samples_per_prompt:
            raise ValueError(f"The global eval batch size ({self.per_device_eval_batch_size} * {devices}) must be "
                             f"divisible by the number of generations used for evaluation "
                             f"({t.eval_samples_per_prompt}).")
        job.model.dtype = "bfloat16" if self.bf16 else "float32"

    def _validated(self, job: Any) -> Any:
        """`job` validated; its one-line error names the arguments (TRL's names), not the job config's keys."""
        try:
            schema.check(job)
            validate = getattr(job, "validate", None)
            if validate is not None:
                validate()
        except (ConfigValueError, ValueError, TypeError) as err:
            message = str(err)
            for key in sorted(self.NAME_OF_KEY, key=len, reverse=True):
                message = message.replace(key, self.NAME_OF_KEY[key])
            raise ValueError(f"{type(self).__name__}: {message}") from None
        return job


def _entries(value: Any) -> list[Any] | None:
    """The entries of a list argument (None when it is not iterable)."""
    try:
        return list(value)
    except TypeError:
        return None


def every(strategy_value: Any, steps: float, rollouts: int, per_rollout: int, per_epoch: int) -> int:
    """A TRL save/eval strategy as jaxcore's every-N-rollouts (-1: never)."""
    name = strategy(strategy_value)
    if name == "no":
        return -1
    if name == "epoch":
        return max(per_epoch // per_rollout, 1)
    every_steps = steps if steps >= 1 else math.ceil(rollouts * per_rollout * steps)
    return max(int(every_steps) // per_rollout, 1)
