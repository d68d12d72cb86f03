"""The Python training API, in TRL's shape; `jaxcore es` and `jaxcore grpo` are thin layers over it.

    from jaxcore import ESTrainer, ESConfig
    trainer = ESTrainer(model="path/to/hf_dir", reward_funcs=[brevity, "exact_match"],
                        train_dataset=rows, eval_dataset=held_out, args=ESConfig())
    summary = trainer.train()      # metrics.jsonl, checkpoints/, reward.png, final_hf/ under args.train.out_dir

`model` is a path (HF directory or jaxcore checkpoint) or a loaded `jaxcore.Transformer` (then pass
`tokenizer`, a directory with the tokenizer files; given with a path, it replaces the model's own). A
Transformer holding LoRA stand-ins (`jaxcore.model.lora.lora_model`) continues training those adapters
(GRPO with `grpo.lora`, their config). `reward_funcs` are TRL-style callables, spec
strings ("my_rewards.py:fn", "pkg.mod:fn", "model:DIR") or built-in names; without them the
config's `rewards.functions` or the task's own rewards are used (with `train_dataset`, none: allowed, as in TRL,
when the environment scores its episodes with `get_reward`). `args.rewards.weights` go one per
reward function (`reward_funcs` or `rewards.functions`); weights without functions are an error.
`train_dataset` / `eval_dataset` are a `datasets.Dataset`, a list of dicts or a path (JSON, JSONL, a
saved HF dataset); every column besides "prompt" reaches the reward functions. Without
`train_dataset` the config's `task` is used. `tools` (functions) and `environment_factory` (an environment
class or factory, or {name: factory}) are TRL's: each row becomes a multi-turn episode (`jaxcore.agents`),
for both trainers. One runtime underneath: `jaxcore.runtime.training.run_training`
and its `Runner`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxcore.config import schema
from jaxcore.errors import ConfigValueError, is_out_of_memory, out_of_memory
from jaxcore.es.config import ESConfig
from jaxcore.grpo.async_config import across_processes, async_refusal
from jaxcore.grpo.config import GRPOConfig
from jaxcore.rewards.file_tasks import dataset_task
from jaxcore.rewards.user_functions import task_with_rewards

if TYPE_CHECKING:
    from jaxcore.runtime.algorithm import Algorithm
    from jaxcore.runtime.runner import Observer

RewardFuncs = Sequence[str | Callable[..., Any]] | str | Callable[..., Any]


class _Trainer:
    config_type: type = ESConfig
    memory_settings = "lower the batch or the lengths"      # what an out-of-memory error says to lower
    takes_rollout_func = False

    @staticmethod
    def algorithm_type(cfg: Any) -> type[Algorithm]:
        """The algorithm this trainer runs with the job `cfg` (imported on use, so `import jaxcore` stays light); a
        static method, since `jaxcore plan` asks the trainer's class."""
        raise NotImplementedError

    def __init__(self, model: Any = None, reward_funcs: RewardFuncs | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, args: Any = None, *, tokenizer: str | None = None,
                 tools: Sequence[Callable[..., Any]] | None = None, environment_factory: Any = None,
                 rollout_func: Callable[[list[Any], Any], dict[str, Any]] | None = None):
        """Checks every argument and every setting of `args` (types and ranges: `jaxcore.config.schema`)
        before any work: a TypeError or ValueError naming the parameter."""
        from jaxcore.runtime import host_allocator

        host_allocator.keep_freed_host_memory()     # before the first JAX work (see that module)
        self.args = args if args is not None else self.config_type()
        if not isinstance(self.args, self.config_type):
            raise TypeError(f"args must be a {self.config_type.__name__}, got {type(self.args).__name__}")
        self.model = None
        if isinstance(model, str) or isinstance(model, os.PathLike):
            self.args.model.path = os.fspath(model)
        elif model is not None:
            if not callable(model) or not hasattr(model, "config"):
                raise TypeError(f"model must be a path or a loaded jaxcore.Transformer, got {type(model).__name__}")
            self.model = model
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            raise TypeError(f"tokenizer must be a directory path, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.reward_funcs = _reward_funcs(reward_funcs)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if not (dataset is None or isinstance(dataset, (str, os.PathLike))
                    or (hasattr(dataset, "__iter__") and not isinstance(dataset, (bytes, Mapping)))):
                raise TypeError(f"{name} must be a path, a datasets.Dataset or a list of dicts, got "
                                f"{type(dataset).__name__}")
        # a generator or other one-shot iterator is read once, now: a run reads its dataset more than once
        train_dataset, eval_dataset = (list(d) if isinstance(d, Iterator) else d for d in (train_dataset, eval_dataset))
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        # TRL's multi-turn arguments (`jaxcore.agents`): tool functions, and an environment class / factory or a
        # {name: factory} mapping chosen per row by its `environment` column
        self.tools, self.environment_factory = list(tools or ()), environment_factory
        # TRL's rollout_func(prompts, trainer): the completions come from the function (GRPO only)
        if rollout_func is not None and not self.takes_rollout_func:
            raise ValueError(f"rollout_func: {type(self).__name__} generates each population member's completions "
                             "with that member's weights; only GRPOTrainer takes a rollout_func")
        self.rollout_func = rollout_func
        self.check_args()

    def check_args(self) -> None:
        """Every setting of `args` against its declared type and range (then the rules between settings):
        ConfigTypeError (a TypeError) or ConfigValueError naming `args.<key>`. `train` checks again."""
        schema.check(self.args, "args.")
        validate = getattr(self.args, "validate", None)
        if validate is not None:
            validate()

    def make_task(self, scored_by_environment: bool = False) -> Any:
        """The task: the datasets with the reward functions, or the configured task (rewards replaced). As in
        TRL, reward functions are optional when an environment scores its episodes (`scored_by_environment`: its
        class defines `get_reward`); without either, a ValueError naming both."""
        from jaxcore.runtime.training import make_task  # lazy: the runtime pulls orbax (checkpoints)

        functions = self.reward_funcs if self.reward_funcs is not None else list(self.args.rewards.functions)
        weights = self.args.rewards.weights
        if weights is not None and not functions:
            raise ConfigValueError("rewards.weights is set but rewards.functions is empty: the weights are one per "
                                   "entry of rewards.functions (to reweight the task's own rewards, list them there)")
        chat_template_kwargs = self.args.rollout.chat_template_kwargs
        if self.train_dataset is None:
            return make_task(self.args.task, functions, weights, scored_by_environment=scored_by_environment,
                             chat_template_kwargs=chat_template_kwargs)
        if not functions and not scored_by_environment:
            raise ValueError("train_dataset needs reward_funcs (or args.rewards.functions), or an environment_factory "
                             "whose environment defines get_reward()")
        task = dataset_task(self.train_dataset, self.eval_dataset, {}, {}, split_seed=self.args.train.seed)
        return (task_with_rewards(task, functions, weights, chat_template_kwargs=chat_template_kwargs,
                                  columns_known=self.rollout_func is None) if functions else task)

    def train(self, resume: bool = False, allow_changes: bool = False, observer: Observer | None = None
              ) -> dict[str, Any]:
        """Train (or continue with `resume`; `allow_changes` accepts a checkpoint written with an incompatible
        config); returns the summary (eval reward before/after, final_hf, ...). `observer` is told of each logged
        step and may end the run there (`runtime.runner.Observer`)."""
        from jaxcore.runtime.training import run_training  # lazy: the runtime pulls orbax (checkpoints)

        if self.model is not None and not (self.tokenizer or self.args.model.path):
            raise ValueError("a loaded model needs tokenizer= (a directory with the tokenizer files)")
        self.check_args()                              # the settings may have been edited since __init__
        try:
            return run_training(self.args, self.algorithm_type(self.args), resume, allow_changes,
                                build_task=self.make_task, model=self.model, tokenizer_dir=self.tokenizer,
                                tools=self.tools, environment_factory=self.environment_factory, observer=observer,
                                rollout_func=self.rollout_func, owner=self)
        except Exception as err:          # the lock is released and the checkpoints kept by the time it is here
            if is_out_of_memory(err):
                raise out_of_memory(err, self.memory_settings) from err
            raise


def _reward_funcs(reward_funcs: Any) -> list[str | Callable[..., Any]] | None:
    """`reward_funcs` as a list, or a TypeError naming the entry that is neither a callable nor a spec string."""
    if reward_funcs is None:
        return None
    if callable(reward_funcs) or isinstance(reward_funcs, str):
        reward_funcs = [reward_funcs]
    if not isinstance(reward_funcs, Sequence):
        raise TypeError(f"reward_funcs must be a callable, a spec string or a list of them, got "
                        f"{type(reward_funcs).__name__}")
    for index, func in enumerate(reward_funcs):
        if not (callable(func) or (isinstance(func, str) and func)):
            raise TypeError(f"reward_funcs[{index}] must be a callable or a non-empty spec string "
                            f"('file.py:fn', 'pkg.mod:fn', 'model:DIR' or a built-in name), got {func!r}")
    return list(reward_funcs)


class ESTrainer(_Trainer):
    """EGGROLL evolution strategies (`jaxcore es`)."""

    config_type = ESConfig
    memory_settings = ("lower es.population or rollout.prompts_per_epoch (the rows generated at once), "
                       "rollout.max_new_tokens, or set es.master_dtype=bfloat16; jaxcore plan shows what a config "
                       "needs")

    @staticmethod
    def algorithm_type(cfg: Any) -> type[Algorithm]:
        from jaxcore.es.algorithm import EggrollAlgorithm  # lazy: the training stack loads on use

        return EggrollAlgorithm


class GRPOTrainer(_Trainer):
    """GRPO with TRL's formulas (`jaxcore grpo`)."""

    config_type = GRPOConfig
    takes_rollout_func = True
    memory_settings = ("lower rollout.prompts_per_epoch or rollout.generations_per_prompt (the rows generated at "
                       "once), rollout.max_new_tokens, raise grpo.gradient_accumulation_steps (smaller "
                       "micro-batches) or set model.remat=true; jaxcore plan shows what a config needs")

    @staticmethod
    def algorithm_type(cfg: Any) -> type[Algorithm]:
        """GRPO, or with `grpo.asynchronous` set, generation and training on disjoint device groups."""
        if cfg.grpo.asynchronous is not None and across_processes(cfg):      # one process trains, one generates
            from jaxcore.grpo.async_processes import AsyncGRPOAcrossProcesses

            return AsyncGRPOAcrossProcesses
        if cfg.grpo.asynchronous is not None:
            from jaxcore.grpo.async_algorithm import AsyncGRPOAlgorithm

            return AsyncGRPOAlgorithm
        from jaxcore.grpo.algorithm import GRPOAlgorithm  # lazy: pulls orbax (reference-model loading)

        return GRPOAlgorithm

    def check_args(self) -> None:
        """As every trainer's, and a run with `grpo.asynchronous` set in a layout its runner does not run yet is one
        line (`async_refusal`, issue 53): no synchronous run under an asynchronous name."""
        super().check_args()
        reason = async_refusal(self.args)
        if reason:
            raise ConfigValueError(reason)
