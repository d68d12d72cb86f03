"""With tools, a rollout row's completion is a whole episode (`rollout.max_episode_tokens`, TRL's
max_completion_length), not one turn (`rollout.max_new_tokens`): `RolloutConfig.completion_tokens` is what the
memory planners and dr_grpo's normaliser count."""

from __future__ import annotations

import dataclasses

import pytest

from jaxcore.es import memory as es_memory
from jaxcore.es.config import ESConfig
from jaxcore.grpo import memory as grpo_memory
from jaxcore.grpo.config import GRPOConfig
from jaxcore.hf.convert import read_json_config
from jaxcore.model.families import config_from_hf
from jaxcore.runtime.config import RolloutConfig

TURN, EPISODE = 16, 256


def test_completion_tokens_are_an_episode_with_tools_or_an_environment():
    assert RolloutConfig(max_new_tokens=TURN, max_episode_tokens=EPISODE).completion_tokens == TURN
    for multi in (RolloutConfig(max_new_tokens=TURN, max_episode_tokens=EPISODE, tools=["t.py:add"]),
                  RolloutConfig(max_new_tokens=TURN, max_episode_tokens=EPISODE, environment_factory="e.py:Env"),
                  RolloutConfig(max_new_tokens=TURN, max_episode_tokens=EPISODE).with_agent()):   # Python API
        assert multi.multi_turn and multi.completion_tokens == EPISODE
        assert multi.cache_tokens == EPISODE + TURN        # the engine's cache keeps one more turn of slots
    plain = RolloutConfig()
    assert plain.with_agent().multi_turn and not plain.multi_turn      # a copy: the caller's config is unchanged
    assert "python_agent" not in dataclasses.asdict(plain.with_agent())        # not a config value


@pytest.mark.parametrize("job_type,plan_job", [(GRPOConfig, grpo_memory.plan_job), (ESConfig, es_memory.plan_job)],
                         ids=["grpo", "es"])
def test_the_memory_planners_count_a_whole_episode(tiny_dir, job_type, plan_job):
    model_cfg = config_from_hf(read_json_config(tiny_dir("llama") / "config.json"))

    def terms(max_new_tokens: int, **rollout) -> dict[str, float]:
        job = job_type()
        job.rollout = RolloutConfig(max_new_tokens=max_new_tokens, max_episode_tokens=EPISODE, **rollout)
        return plan_job(job, model_cfg, devices=1, prompt_tokens=64).terms

    multi = terms(TURN, tools=["t.py:add"])
    # as a single-turn rollout whose completions are whole episodes, its KV cache one turn longer
    assert multi["kv cache"] == terms(EPISODE + TURN)["kv cache"] > terms(TURN)["kv cache"]
    if job_type is GRPOConfig:
        assert multi["activations"] == terms(EPISODE)["activations"] > terms(TURN)["activations"]
