"""TRL 1.16's asynchronous GRPO surface (`trl.experimental.async_grpo`) on jaxcore: `AsyncGRPOConfig` takes its
arguments by TRL's names and defaults, each mapped onto the job config (`grpo.asynchronous`, the loss's epsilons,
TRL's accounting of one batch per optimizer step), accepted with one warning (the vLLM server's settings: jaxcore
generates on its own rollout devices) or refused in one line; `AsyncGRPOTrainer` takes TRL's constructor.

    from jaxcore.trl import AsyncGRPOConfig, AsyncGRPOTrainer    # was: from trl.experimental.async_grpo import ...

What is not built yet is the runner that generates on one device group while the other trains (issue 53): a
trainer whose arguments are otherwise valid stops at construction with one line saying so, rather than training
synchronously under an asynchronous name. The tables here are docs/coming-from-trl.md's (`arguments_markdown`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from jaxcore.api import GRPOTrainer as JobGRPOTrainer
from jaxcore.errors import ConfigValueError
from jaxcore.grpo.async_config import AsyncOptions
from jaxcore.grpo.config import GRPOConfig as JobConfig
from jaxcore.trl.arguments import HANDLED as GRPO_HANDLED
from jaxcore.trl.arguments import IGNORED as GRPO_IGNORED
from jaxcore.trl.arguments import REFUSED as GRPO_REFUSED
from jaxcore.trl.arguments import TRL_DEFAULTS, optimizer_refusals
from jaxcore.trl.flat_arguments import NAME_OF_KEY, FlatArguments
from jaxcore.trl.trainer import Trainer, lora_config

TRAINING_ARGUMENTS = list(TRL_DEFAULTS)[:list(TRL_DEFAULTS).index("model_init_kwargs")]   # transformers' own
# TRL's AsyncGRPOConfig: transformers' arguments (five defaults of its own), then its own arguments in its order
TRL_ASYNC_DEFAULTS: dict[str, Any] = {
    **{name: TRL_DEFAULTS[name] for name in TRAINING_ARGUMENTS},
    "logging_steps": 1, "lr_scheduler_type": "constant", "ignore_data_skip": True, "remove_unused_columns": True,
    "model_init_kwargs": None, "dtype": "float32", "trust_remote_code": False, "router_aux_loss_coef": None,
    "num_generations": 8, "max_completion_length": 2048, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "min_p": None, "repetition_penalty": 1.0, "chat_template_kwargs": None, "max_tool_calling_iterations": None,
    "fork_threshold_tokens": 1024, "vllm_server_base_url": "http://localhost:8000", "vllm_server_timeout": 240.0,
    "request_timeout": 600, "weight_sync_timeout": 1800, "epsilon": 0.2, "epsilon_high": None, "token_budget": None,
    "max_inflight_tasks": -1, "max_staleness": 4, "queue_maxsize": 1024, "weight_sync_steps": 1,
    "heartbeat_stale_after_s": 300.0, "log_completions": False, "num_completions_to_print": None,
}
JAXCORE_OWN: dict[str, tuple[Any, str]] = {     # arguments TRL does not have -> (default, where they go)
    "rollout_devices": (None, "grpo.asynchronous.rollout_devices: the JAX devices that generate (None: half of "
                              "them); the others train (TRL: the vLLM server's GPUs)"),
    "async_mode": ("deterministic", "grpo.asynchronous.mode: deterministic (batch k from the weights max_staleness "
                                    "versions back: reproducible) or free_running (TRL's: staleness by timing)"),
}
ASYNC_DEFAULTS: dict[str, Any] = {**TRL_ASYNC_DEFAULTS, **{name: d for name, (d, _) in JAXCORE_OWN.items()}}

_ROLLOUT = ("jaxcore generates on its own rollout devices (rollout_devices) and moves the weights over the device "
            "interconnect: no vLLM server")
_SCHEDULE = ("the rollout devices generate the batches the schedule names, at most max_staleness weight versions "
             "ahead of training: nothing else is in flight or queued")
_PER_STEP = "one jaxcore rollout per optimizer step"
ASYNC_HANDLED: dict[str, str] = {
    **{name: GRPO_HANDLED[name] for name in TRL_ASYNC_DEFAULTS if name in GRPO_HANDLED and name not in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs", "max_steps", "save_steps",
        "eval_steps", "auto_find_batch_size")},
    "per_device_train_batch_size": "rollout.prompts_per_epoch = per_device_train_batch_size x training devices x "
                                   "gradient_accumulation_steps / num_generations: the completions of one optimizer "
                                   f"step ({_PER_STEP}; TRL's fixed-count micro-batches; a device is a JAX device "
                                   "outside rollout_devices)",
    "gradient_accumulation_steps": "grpo.gradient_accumulation_steps and grpo.steps_per_generation (the micro-batches "
                                   "of one optimizer step)",
    "num_train_epochs": f"train.epochs = ceil(num_train_epochs x rows / prompts per optimizer step) ({_PER_STEP}; "
                        "TRL counts the distinct prompts trained on)",
    "max_steps": f"train.epochs = max_steps ({_PER_STEP})",
    "save_steps": "train.checkpoint_every = save_steps",
    "eval_steps": "train.eval_every = eval_steps (None: logging_steps)",
    "epsilon": "grpo.epsilon (the async loss's lower clip: jaxcore.grpo.async_loss)",
    "epsilon_high": "grpo.epsilon_high (None: epsilon)",
    "max_staleness": "grpo.asynchronous.max_staleness (weight versions; deterministic: every batch is generated that "
                     "many versions back, capped by the versions there are)",
    "weight_sync_steps": "grpo.asynchronous.weight_sync_steps",
    "token_budget": "> 0: grpo.token_budget (slots per packed row, shared tokens counted once: jaxcore.grpo.packing); "
                    "None or <= 0: fixed-count micro-batches of per_device_train_batch_size x devices completions, "
                    "each group's prompt once per tree at the bucket widths",
    **{name: where for name, (_, where) in JAXCORE_OWN.items()},
}
ASYNC_REFUSED: dict[str, str] = {
    **{name: why for name, why in GRPO_REFUSED.items() if name in TRL_ASYNC_DEFAULTS},
    "auto_find_batch_size": "a batch must hold whole prompt groups of num_generations completions",
    "dtype": "jaxcore keeps float32 master weights (TRL's default); bf16=True computes in bfloat16",
}
ASYNC_IGNORED: dict[str, str] = {
    **{name: GRPO_IGNORED[name] for name in TRL_ASYNC_DEFAULTS if name in GRPO_IGNORED},
    **dict.fromkeys(("vllm_server_base_url", "vllm_server_timeout", "request_timeout", "weight_sync_timeout",
                     "heartbeat_stale_after_s"), _ROLLOUT),
    "max_inflight_tasks": _SCHEDULE, "queue_maxsize": _SCHEDULE,
    "remove_unused_columns": "every column reaches the reward functions",
    "fork_threshold_tokens": "jaxcore's multi-turn episodes keep each turn's tokens in the KV cache (no "
                             "re-tokenization of the conversation, so no row forks)",
}
ASYNC_NAME_OF_KEY = {
    **NAME_OF_KEY, "grpo.epsilon_high": "epsilon_high", "grpo.epsilon": "epsilon",
    "grpo.asynchronous.rollout_devices": "rollout_devices", "grpo.asynchronous.max_staleness": "max_staleness",
    "grpo.asynchronous.weight_sync_steps": "weight_sync_steps", "grpo.asynchronous.mode": "async_mode",
    "grpo.gradient_accumulation_steps": "gradient_accumulation_steps", "grpo.token_budget": "token_budget",
}


class AsyncGRPOConfig(FlatArguments):
    """TRL 1.16's `trl.experimental.async_grpo.AsyncGRPOConfig`, keyword for keyword, plus jaxcore's
    `rollout_devices` and `async_mode` (`JAXCORE_OWN`): every argument is an attribute with TRL's default."""

    DEFAULTS, HANDLED, IGNORED, REFUSED = ASYNC_DEFAULTS, ASYNC_HANDLED, ASYNC_IGNORED, ASYNC_REFUSED
    NAME_OF_KEY = ASYNC_NAME_OF_KEY
    # GRPOConfig's arguments that AsyncGRPOConfig does not take, at the value that leaves the shared mapping alone
    generation_kwargs = reward_weights = num_generations_eval = None

    def _probe(self) -> None:
        """The run counts its devices later: any count whose optimizer steps hold whole groups will do here."""
        per_device = self.per_device_train_batch_size * self.gradient_accumulation_steps
        training = self.num_generations // math.gcd(per_device, self.num_generations)
        devices = training + (self.rollout_devices or training)
        self.to_job_config(devices, train_rows=self.prompts_per_step(training))

    def _named(self, err: Exception) -> ValueError:
        """`err` as one line naming the arguments (TRL's names), not the job config's keys."""
        message = str(err)
        for key in sorted(self.NAME_OF_KEY, key=len, reverse=True):
            message = message.replace(key, self.NAME_OF_KEY[key])
        return ValueError(f"{type(self).__name__}: {message}")

    def _refused_values(self) -> list[str]:
        return super()._refused_values() + optimizer_refusals(self)

    def async_options(self) -> AsyncOptions:
        """The job's `grpo.asynchronous` section."""
        try:
            return AsyncOptions(rollout_devices=self.rollout_devices, max_staleness=self.max_staleness,
                                weight_sync_steps=self.weight_sync_steps, mode=self.async_mode)
        except ConfigValueError as err:
            raise self._named(err) from None

    def prompts_per_step(self, training_devices: int) -> int:
        """Prompts of one optimizer step on `training_devices`: its completions (per_device_train_batch_size x
        devices x gradient_accumulation_steps, TRL's fixed count) over num_generations; one line unless whole
        groups."""
        completions = self.per_device_train_batch_size * training_devices * self.gradient_accumulation_steps
        if completions % self.num_generations:
            raise ValueError(f"per_device_train_batch_size x training devices x gradient_accumulation_steps = "
                             f"{completions} completions per optimizer step must be a multiple of num_generations "
                             f"({self.num_generations}) in jaxcore (a batch holds whole prompt groups)")
        return completions // self.num_generations

    def optimizer_steps(self, training_devices: int, train_rows: int | None) -> tuple[int, int]:
        """(the run's optimizer steps, optimizer steps per pass over `train_rows` prompts)."""
        prompts = self.prompts_per_step(training_devices)
        per_epoch = max((train_rows or 0) // prompts, 1)
        if self.max_steps > 0:
            return self.max_steps, per_epoch
        if train_rows is None:
            raise ValueError("max_steps must be set when the train dataset's length is not known")
        return math.ceil(self.num_train_epochs * train_rows / prompts), per_epoch

    def to_job_config(self, devices: int = 2, train_rows: int | None = None) -> JobConfig:
        """jaxcore's job config for this run on `devices` JAX devices (rollout_devices of them generate) with
        `train_rows` prompts: one jaxcore epoch is one optimizer step's batch of whole prompt groups."""
        options = self.async_options()
        try:
            _, training = options.device_groups(devices)
        except ValueError as err:
            raise self._named(err) from None
        total, per_epoch = self.optimizer_steps(training, train_rows)
        job = JobConfig()
        job.rollout.prompts_per_epoch = self.prompts_per_step(training)
        self._map_sampling(job)
        self._map_optimizer(job, total, "adamw")
        self._map_train(job, total, 1, per_epoch, training)
        job.model.remat = bool(self.activation_checkpointing)
        job.train.shuffle = False               # TRL's rollout worker walks the dataset in its order
        g = job.grpo
        g.epsilon, g.epsilon_high = self.epsilon, self.epsilon_high
        g.gradient_accumulation_steps = g.steps_per_generation = self.gradient_accumulation_steps
        g.asynchronous = options
        g.token_budget = self.token_budget if self.token_budget is not None and self.token_budget > 0 else None
        return self._validated(job)


class AsyncGRPOTrainer(Trainer):
    """TRL 1.16's `trl.experimental.async_grpo.AsyncGRPOTrainer`, argument for argument, on jaxcore's asynchronous
    runner (`jaxcore.grpo.async_algorithm`: the job's `grpo.asynchronous`); what that runner does not run yet is one
    line at construction (`jaxcore.grpo.async_config.async_refusal`)."""

    args_type, job_trainer_type = AsyncGRPOConfig, JobGRPOTrainer
    memory_settings = ("lower per_device_train_batch_size or num_generations (the completions generated at once), "
                       "max_completion_length or raise rollout_devices")

    def __init__(self, model: Any, reward_funcs: Any = None, args: AsyncGRPOConfig | None = None,
                 train_dataset: Any = None, processing_class: Any = None, callbacks: Sequence[Any] | None = None,
                 optimizers: tuple[Any, Any] = (None, None), peft_config: Any = None,
                 tools: Sequence[Callable[..., Any]] | None = None, environment_factory: Any = None,
                 rollout_worker: Any = None, weight_transfer: Any = None) -> None:
        unsupported = [name for name, value in (("optimizers", any(o is not None for o in optimizers)),
                                                ("rollout_worker", rollout_worker is not None),
                                                ("weight_transfer", weight_transfer is not None)) if value]
        if unsupported:
            raise ValueError(f"not supported by jaxcore: {', '.join(unsupported)} (jaxcore builds AdamW from args, "
                             "generates on its own rollout devices and moves the weights itself)")
        if peft_config is not None:
            self.lora = lora_config(peft_config)
        super().__init__(model, reward_funcs, args, train_dataset, None, processing_class, callbacks, tools=tools,
                         environment_factory=environment_factory)

    def _job_config(self, devices: int) -> Any:
        job = super()._job_config(devices)
        job.grpo.lora = self.lora
        return job

    def _steps(self, job: Any, devices: int) -> tuple[int, int]:
        return 1, self.args.optimizer_steps(job.grpo.asynchronous.device_groups(devices)[1], self.train_rows)[1]


def arguments_markdown() -> str:
    """docs/coming-from-trl.md's tables of AsyncGRPOConfig's arguments, from `ASYNC_HANDLED`, `ASYNC_IGNORED` and
    `ASYNC_REFUSED`."""
    out = []
    for heading, table, column in (("Mapped", ASYNC_HANDLED, "in jaxcore"),
                                   ("Accepted without effect (one warning when set to another value)", ASYNC_IGNORED,
                                    "what jaxcore does instead"),
                                   ("Refused when set to another value (one line)", ASYNC_REFUSED, "why")):
        rows = "".join(f"| `{name}` | `{ASYNC_DEFAULTS[name]!r}` | {text} |\n" for name, text in table.items())
        out.append(f"#### {heading}\n\n| argument | default | {column} |\n|---|---|---|\n{rows}")
    return "\n".join(out)
