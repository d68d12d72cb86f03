"""TRL's rollout_func as a run's rollout (`jaxcore.agents.rollout_function`): its ids laid out as episodes, its
extra keys as reward columns, and its mistakes as one line."""

from __future__ import annotations

import types

import numpy as np
import pytest

from jaxcore.agents.rollout_function import RolloutFunction, checked_output
from jaxcore.errors import TaskError
from jaxcore.rewards import Example

MODEL = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=50, max_position_embeddings=64))


def scripted(prompts, trainer):
    return {"prompt_ids": [[1, 2, 3], [4]], "completion_ids": [[5, 6, 0], [7, 8, 9, 10, 11]],
            "logprobs": [[0.0] * 3, [0.0] * 5], "env_mask": [[1, 0, 1], [1, 1, 1, 1, 1]],
            "source": ["a", "b"], "level": 3}


def test_the_functions_ids_become_episodes_with_its_mask_and_columns():
    got = []
    agent = RolloutFunction(lambda prompts, trainer: got.append((prompts, trainer)) or scripted(prompts, trainer),
                            owner="the trainer", max_episode_tokens=4)
    examples = [Example([{"role": "user", "content": "hi"}]), Example("plain")]
    episodes = agent.episodes(MODEL, None, examples, pad_token_id=49, eos_token_ids=(0,))
    assert got == [([[{"role": "user", "content": "hi"}], "plain"], "the trainer")]
    assert got[0][0][0] is not examples[0].prompt                  # a copy, as TRL passes
    np.testing.assert_array_equal(episodes.prompt_ids_BT, [[1, 2, 3], [49, 49, 4]])
    np.testing.assert_array_equal(episodes.prompt_mask_BT, [[1, 1, 1], [0, 0, 1]])
    np.testing.assert_array_equal(np.asarray(episodes.result.tokens), [[5, 6, 0, 49], [7, 8, 9, 10]])
    np.testing.assert_array_equal(np.asarray(episodes.result.lengths), [3, 4])             # cut at 4 tokens
    np.testing.assert_array_equal(np.asarray(episodes.result.finished), [True, False])
    np.testing.assert_array_equal(episodes.model_mask_BE, [[1, 0, 1, 0], [1, 1, 1, 1]])
    assert episodes.hit_limit_B.tolist() == [False, True]
    assert episodes.columns == [{"source": "a", "level": 3}, {"source": "b", "level": 3}]
    assert episodes.scoring()["columns"] == episodes.columns and episodes.scoring()["messages"] is None


@pytest.mark.parametrize("output, message", [
    ({"prompt_ids": [[1]], "completion_ids": [[2]]}, "rollout_func must return keys ['logprobs'] in its output dict."),
    ({"prompt_ids": [[1]], "completion_ids": [[2], [3]], "logprobs": []}, "completion_ids: expected a list of 1"),
    ({"prompt_ids": [[1]], "completion_ids": [[99]], "logprobs": []}, "outside the model's vocabulary of 50"),
    ({"prompt_ids": [[]], "completion_ids": [[2]], "logprobs": []}, "a row has an empty prompt"),
    ([1, 2], "rollout_func must return a dict, got list"),
    ({"prompt_ids": [[1]], "completion_ids": [[2, 3, 4]], "logprobs": [], "env_mask": [[1]]},   # was broadcast
     "env_mask: each row must be a 0/1 list as long as its completion_ids row"),
    ({"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [], "env_mask": [[2]]}, "env_mask: each row"),
    ({"prompt_ids": [[1]], "completion_ids": [[5.7]], "logprobs": []}, "completion_ids[0]: 5.7 is not an integer"),
    ({"prompt_ids": [[1]], "completion_ids": [[True]], "logprobs": []}, "completion_ids[0]: True is not an integer"),
    ({"prompt_ids": [["5"]], "completion_ids": [[2]], "logprobs": []}, "prompt_ids[0]: '5' is not an integer"),
    ({"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [], "env_mask": [[0.5]]}, "0.5 is not an integer"),
    ({"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [], "source": []},     # was padded with None
     "rollout_func's source: a list of 0 values for 1 rows"),
])
def test_a_wrong_output_is_one_line(output, message):
    with pytest.raises(TaskError) as err:
        checked_output(output, 1, 50)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_only_grpo_takes_a_rollout_func_and_never_with_tools():
    from jaxcore.agents import build_agent
    from jaxcore.api import ESTrainer
    from jaxcore.grpo.config import GRPOConfig

    with pytest.raises(ValueError, match="only GRPOTrainer takes a rollout_func"):
        ESTrainer(rollout_func=scripted)
    cfg = GRPOConfig()
    with pytest.raises(TaskError, match="takes no tools or environment_factory"):
        build_agent(cfg.rollout, cfg.rewards, tools=[len], rollout_func=scripted)
