"""The Python training API, in TRL's shape; `jaxcore es` and `jaxcore grpo` are thin layers over it.

    from jaxcore import ESTrainer, ESConfig
    trainer = ESTrainer(model="path/to/hf_dir", reward_funcs=[brevity, "exact_match"],
                        train_dataset=rows, eval_dataset=held_out, args=ESConfig())
    summary = trainer.train()      # metrics.jsonl, checkpoints/, reward.png, final_hf/ under args.train.out_dir

`model` is a path (HF directory or jaxcore checkpoint) or a loaded `jaxcore.Transformer` (then pass
`tokenizer`, a directory with the tokenizer files). `reward_funcs` are TRL-style callables, spec
strings ("my_rewards.py:fn", "pkg.mod:fn", "model:DIR") or built-in names; without them the
config's `rewards.functions` or the task's own rewards are used. `args.rewards.weights` go one per
reward function (`reward_funcs` or `rewards.functions`); weights without functions are an error.
`train_dataset` / `eval_dataset` are a `datasets.Dataset`, a list of dicts or a path (JSON, JSONL, a
saved HF dataset); every column besides "prompt" reaches the reward functions. Without
`train_dataset` the config's `task` is used. One runtime underneath: `jaxcore.runtime.runner.run_training`
and its `Runner`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jaxcore.errors import ConfigValueError
from jaxcore.es.config import ESConfig
from jaxcore.grpo.config import GRPOConfig
from jaxcore.rewards.file_tasks import dataset_task
from jaxcore.rewards.user_functions import task_with_rewards

if TYPE_CHECKING:
    from jaxcore.runtime.algorithm import Algorithm

RewardFuncs = Sequence[str | Callable[..., Any]] | str | Callable[..., Any]


class _Trainer:
    config_type: type = ESConfig

    @staticmethod
    def algorithm_type() -> type[Algorithm]:
        """The algorithm this trainer runs (imported on use, so `import jaxcore` stays light)."""
        raise NotImplementedError

    def __init__(self, model: Any = None, reward_funcs: RewardFuncs | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, args: Any = None, *, tokenizer: str | None = None):
        self.args = args if args is not None else self.config_type()
        if not isinstance(self.args, self.config_type):
            raise TypeError(f"args must be a {self.config_type.__name__}, got {type(self.args).__name__}")
        self.model = None
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            self.args.model.path = str(model)
        elif model is not None:
            self.model = model
        self.tokenizer = tokenizer
        if callable(reward_funcs) or isinstance(reward_funcs, str):
            reward_funcs = [reward_funcs]
        self.reward_funcs = list(reward_funcs) if reward_funcs is not None else None
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset

    def make_task(self) -> Any:
        """The task: the datasets with the reward functions, or the configured task (rewards replaced)."""
        from jaxcore.runtime.runner import make_task  # lazy: the runner pulls orbax (checkpoints)

        functions = self.reward_funcs if self.reward_funcs is not None else list(self.args.rewards.functions)
        weights = self.args.rewards.weights
        if weights is not None and not functions:
            raise ConfigValueError("rewards.weights is set but rewards.functions is empty: the weights are one per "
                                   "entry of rewards.functions (to reweight the task's own rewards, list them there)")
        if self.train_dataset is None:
            return make_task(self.args.task, functions, weights)
        if not functions:
            raise ValueError("train_dataset needs reward_funcs (or args.rewards.functions)")
        task = dataset_task(self.train_dataset, self.eval_dataset, {}, {}, split_seed=self.args.train.seed)
        return task_with_rewards(task, functions, weights)

    def train(self, resume: bool = False, allow_changes: bool = False) -> dict[str, Any]:
        """Train (or continue with `resume`; `allow_changes` accepts a checkpoint written with an incompatible
        config); returns the summary (eval reward before/after, final_hf, ...)."""
        from jaxcore.runtime.runner import run_training  # lazy: the runner pulls orbax (checkpoints)

        if self.model is not None and not (self.tokenizer or self.args.model.path):
            raise ValueError("a loaded model needs tokenizer= (a directory with the tokenizer files)")
        return run_training(self.args, self.algorithm_type(), resume, allow_changes, build_task=self.make_task,
                            model=self.model, tokenizer_dir=self.tokenizer)


class ESTrainer(_Trainer):
    """EGGROLL evolution strategies (`jaxcore es`)."""

    config_type = ESConfig

    @staticmethod
    def algorithm_type() -> type[Algorithm]:
        from jaxcore.es.algorithm import EggrollAlgorithm  # lazy: the training stack loads on use

        return EggrollAlgorithm


class GRPOTrainer(_Trainer):
    """GRPO with TRL's formulas (`jaxcore grpo`)."""

    config_type = GRPOConfig

    @staticmethod
    def algorithm_type() -> type[Algorithm]:
        from jaxcore.grpo.algorithm import GRPOAlgorithm  # lazy: pulls orbax (reference-model loading)

        return GRPOAlgorithm
