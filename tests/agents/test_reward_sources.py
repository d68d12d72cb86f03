"""Reward sources of a multi-turn run, as TRL has them: a reward function naming `environments` gets the rows'
live environment instances (one per completion, in order; called in this process, also when the other functions
run in worker processes), and reward functions are optional exactly when an environment scores (`get_reward`)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import trl_tools  # noqa: E402
from counting import TRAIN  # noqa: E402

from jaxcore import ESConfig, GRPOTrainer  # noqa: E402
from jaxcore.config.schema import check  # noqa: E402
from jaxcore.errors import TaskError, UserError  # noqa: E402
from jaxcore.rewards import Example, Scorer  # noqa: E402
from jaxcore.rewards.config import TaskConfig  # noqa: E402
from jaxcore.rewards.user_functions import resolve_rewards  # noqa: E402
from jaxcore.runtime.rollout import with_extra  # noqa: E402


class LockedCounter:
    """An environment that cannot be pickled (it holds a lock) and records which process read its counter."""

    def __init__(self, counter: int):
        self.lock, self._counter, self.read_by = threading.Lock(), counter, []

    @property
    def counter(self) -> int:
        self.read_by.append(os.getpid())
        return self._counter


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-process"])
def test_a_reward_function_naming_environments_reads_the_live_instances(workers):
    counters = [3, 1, 4, 1, 5]
    environments = [LockedCounter(c) for c in counters]

    def negated(environments, **kwargs):            # a closure: it cannot be pickled, and never has to be
        return [-env.counter for env in environments]

    fns, weights = resolve_rewards([trl_tools.counted, trl_tools.said_done, negated])
    with Scorer(fns, weights, num_workers=workers, chunk_size=2) as scorer:       # chunks: the order is kept
        scores = scorer.score(["done"] * 5, [Example(f"p{i}") for i in range(5)], environments)
    assert scores.per_function["counted"].tolist() == counters
    assert scores.per_function["negated"].tolist() == [-c for c in counters]
    assert scores.per_function["said_done"].tolist() == [1.0] * 5        # in the worker when there is one
    assert scores.failures == {"counted": 0, "said_done": 0, "negated": 0}
    assert all(env.read_by == [os.getpid()] * 2 for env in environments)   # in this process, not a pickled copy


def test_without_reward_functions_the_environment_reward_is_the_reward():
    with Scorer({}) as scorer:
        scores = scorer.score(["a", "b"], [Example("x"), Example("y")])
    assert scores.rewards_B.tolist() == [0.0, 0.0] and scores.per_function == {}
    extra = with_extra(scores, {"IncrementEnv": np.array([2.0, 4.0])})
    assert extra.rewards_B.tolist() == [2.0, 4.0] and list(extra.per_function) == ["IncrementEnv"]


def test_a_file_task_scored_by_its_environment_needs_no_answers_and_no_reward_function(tmp_path):
    from jaxcore.runtime.training import make_task

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Count to 2."}\n{"prompt": "Count to 4."}\n')
    section = TaskConfig("file", {"path": str(data), "eval_path": str(data)})
    task = make_task(section, scored_by_environment=True)
    assert task.reward_fns == {} and [e.prompt for e in task.train] == ["Count to 2.", "Count to 4."]
    with pytest.raises(TaskError, match="answer"):          # no environment reward: the default exact_match
        make_task(section)


def test_the_python_api_needs_reward_funcs_or_an_environment_that_scores():
    rows = [{"prompt": r["prompt"]} for r in TRAIN] * 5
    trainer = GRPOTrainer("unused", None, rows, args=None, environment_factory=trl_tools.IncrementEnv)
    assert trainer.make_task(scored_by_environment=True).reward_fns == {}
    with pytest.raises(ValueError, match="needs reward_funcs .* or an environment_factory whose environment "
                                         "defines get_reward"):
        trainer.make_task(scored_by_environment=False)


def test_a_run_with_no_reward_source_is_one_line(tmp_path):
    """A task without reward functions (here from a custom `build_task`) and no environment reward: refused
    before the model is read."""
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.rewards.file_tasks import dataset_task
    from jaxcore.runtime.training import run_training

    args = ESConfig()
    args.train.out_dir = str(tmp_path / "out")
    check(args)
    with pytest.raises(UserError, match="^no reward source: give reward functions .* or an environment_factory"):
        run_training(args, EggrollAlgorithm, build_task=lambda **_: dataset_task(TRAIN * 5, None, {}, {}))


def test_an_environment_reward_too_large_for_a_float_is_a_counted_failure():
    """`get_reward` returning 10**400 is a failed reward for its row, counted (before: OverflowError ended the run
    with "unexpected OverflowError")."""
    from types import SimpleNamespace

    from jaxcore.agents.engine import _env_rewards

    class Huge:
        def get_reward(self) -> int:
            return 10**400

    agent = SimpleNamespace(environments=SimpleNamespace(reward_classes={"Huge": Huge}), timeout_s=5.0)
    rewards, failures = _env_rewards(agent, [Huge(), Huge()], [Huge, Huge], np.zeros(2, bool))
    assert failures == {"Huge": 2} and np.isnan(rewards["Huge"]).all()
