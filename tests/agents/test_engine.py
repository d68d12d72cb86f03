"""The multi-turn engine (`jaxcore.agents`) on a real model that writes a known script (`scripted.py`): tool calls
parsed and run, results appended as tool messages, model/tool token masks, failing tools as error messages,
environments per row, the episode token limit, and the KV cache kept across turns against re-prefilling."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import trl_tools  # noqa: E402
from scripted import conversation, scripted_model  # noqa: E402

from jaxcore.agents import Agent, ToolCall, build_agent, parse_tool_calls, run_episodes, tool_schema  # noqa: E402
from jaxcore.agents.environments import Environments, resolve_factories  # noqa: E402
from jaxcore.agents.tools import load_tools  # noqa: E402
from jaxcore.errors import TaskError  # noqa: E402
from jaxcore.rewards.types import Example  # noqa: E402
from jaxcore.runtime.config import RolloutConfig  # noqa: E402

EXAMPLE = Example("What is 2 + 3?", answer=5)
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def path(tiny_dir) -> Path:
    return tiny_dir("gpt2", max_pos=4096)      # the byte tokenizer's prompts with a tool description are long


@pytest.fixture(scope="module")
def tokenizer(path):
    from jaxcore.hf.tokenization import load_tokenizer

    return load_tokenizer(path)


def roll(agent, model, tokenizer, examples, *, max_new_tokens=80, key=None, **kw):
    return run_episodes(agent, model, tokenizer, examples, RolloutConfig(max_new_tokens=max_new_tokens,
                                                                         temperature=1.0),
                        key=key, eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id, **kw)


def episode_tokens(episodes, row):
    n = int(np.asarray(episodes.result.lengths)[row])
    return np.asarray(episodes.result.tokens)[row, :n].tolist(), episodes.model_mask_BE[row, :n].tolist()


# ----------------------------------------------------------------------------- parsing and schemas


def test_parse_tool_calls_reads_the_hermes_format_and_names_what_is_malformed():
    text = ('x <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
            '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "g"')
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("f", {"x": 1})]
    assert "not JSON" in calls[2].error and '{"name"' in calls[3].error and "no </tool_call>" in calls[4].error
    assert parse_tool_calls("no call here") == []


def test_tools_and_environments_are_described_from_type_hints_and_docstrings():
    assert tool_schema(trl_tools.add)["function"]["parameters"]["required"] == ["a", "b"]
    envs = Environments(resolve_factories(trl_tools.IncrementEnv))
    assert [s["function"]["name"] for s in envs.schemas[None]] == ["increment"]      # not reset / get_reward
    assert envs.reward_classes == {"IncrementEnv": trl_tools.IncrementEnv}

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(TaskError, match="tool 'undocumented' cannot be described.*docstring"):
        load_tools([undocumented])
    with pytest.raises(TaskError, match="no reset method"):
        Environments(resolve_factories(dict))
    with pytest.raises(TaskError, match="tool 'nowhere.py:f'.*not found"):
        load_tools(["nowhere.py:f"])


def test_limits_are_checked_when_the_agent_is_built():
    rollout = RolloutConfig(tools=["tests/agents/trl_tools.py:add"], max_new_tokens=64, max_episode_tokens=32)
    with pytest.raises(TaskError, match="max_episode_tokens=32 is below rollout.max_new_tokens=64"):
        build_agent(rollout, _Rewards())
    assert build_agent(RolloutConfig(), _Rewards()) is None          # single-turn: nothing configured


class _Rewards:
    timeout_s, num_workers = 5.0, 0


def test_a_standalone_tool_named_like_an_environment_method_is_one_line():
    """Both would be offered to the model, and only the method called (TRL's tool dict too): the tool never ran."""
    def increment(step: int) -> int:
        """A standalone tool with the environment's method's name.

        Args:
            step: how much.
        """
        return step

    rollout = RolloutConfig(max_new_tokens=8, max_episode_tokens=32)
    with pytest.raises(TaskError) as err:
        build_agent(rollout, _Rewards(), tools=[increment], environment_factory=trl_tools.IncrementEnv)
    assert "'increment' is both a standalone tool and a method of" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- episodes


def test_a_tool_call_runs_and_its_result_is_appended_and_masked(path, tokenizer):
    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=128)
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", CALL), ("tool", [("add", "5")]),
                                                               ("model", "5")])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    episodes = roll(agent, model, tokenizer, [EXAMPLE] * 4, key=jax.random.key(0))
    tokens, mask = episode_tokens(episodes, 3)
    assert tokens == episode
    call_tokens = len(tokenizer(CALL)["input_ids"]) + 1
    suffix = len(episode) - call_tokens - 2
    assert mask == written == [1] * call_tokens + [0] * suffix + [1, 1]     # the tool message is not the model's
    assert tokenizer.decode(tokens[call_tokens:call_tokens + suffix]).startswith("<|tool|>5")
    metrics = episodes.metrics()
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failures"] == 0
    assert metrics["episodes/turns_mean"] == 2.0 and metrics["episodes/external_tokens_mean"] == suffix
    assert np.asarray(episodes.result.finished).all()
    assert (np.asarray(episodes.result.logprobs)[3, :len(tokens)][np.array(mask) == 0] == 0).all()


def one_round_of_calls(agent, path, tokenizer, calls, results):
    """Two rows whose scripted model makes `calls` once, reads `results` back and says "ok": (the expected episode's
    tokens, the episodes)."""
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", calls), ("tool", results),
                                                               ("model", "ok")])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    return episode, roll(agent, model, tokenizer, [EXAMPLE] * 2, max_new_tokens=len(calls) + 8)


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-process"])
def test_crashing_hanging_and_malformed_calls_become_errors_the_model_reads(path, tokenizer, workers):
    calls = ('<tool_call>{"name": "crash", "arguments": {"x": 1}}</tool_call>'
             '<tool_call>{"name": "hang", "arguments": {"x": 1}}</tool_call>'
             '<tool_call>{"name": "add", "arguments": {"a": 2,}}</tool_call>'
             '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    tools = [trl_tools.crash, trl_tools.hang, trl_tools.add] + ([trl_tools.die] if workers else [])
    if workers:
        calls += '<tool_call>{"name": "die", "arguments": {"x": 1}}</tool_call>'
    agent = Agent(load_tools(tools), max_episode_tokens=768, timeout_s=0.5, num_workers=workers)
    try:
        results = [("crash", "{'error': 'RuntimeError: tool broke on 1'}"),
                   ("hang", "{'error': 'timed out after 0.5 s" + ("'}" if not workers else " (worker killed)'}")),
                   ("unknown", "{'error': 'malformed tool call: not JSON (Expecting property name enclosed in "
                               "double quotes at char 37)'}"),
                   ("nope", "{'error': 'Tool nope not found.'}")]
        if workers:
            results.append(("die", "{'error': 'worker process died (exit code 3)'}"))
        episode, episodes = one_round_of_calls(agent, path, tokenizer, calls, results)
    finally:
        agent.close()
    assert episode_tokens(episodes, 0)[0] == episode          # every error came back as that tool message
    assert episodes.tool_calls_B.tolist() == [len(results)] * 2
    assert episodes.tool_failures_B.tolist() == [len(results)] * 2
    assert episodes.metrics()["tools/failure_frequency"] == 1.0 and episodes.turns_B.tolist() == [2, 2]


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-process"])
def test_an_async_tool_is_awaited_and_an_untextable_result_is_a_failed_call(path, tokenizer, workers):
    """An async tool's result is what it returns (before: its coroutine's repr, as a success), and a result whose
    `str` raises is an error the model reads, counted (before, in process: "unexpected ValueError" ended the run)."""
    calls = ('<tool_call>{"name": "async_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
             '<tool_call>{"name": "untextable", "arguments": {"x": 1}}</tool_call>')
    agent = Agent(load_tools([trl_tools.async_add, trl_tools.untextable]), max_episode_tokens=512, timeout_s=5.0,
                  num_workers=workers)
    try:
        episode, episodes = one_round_of_calls(agent, path, tokenizer, calls, [
            ("async_add", "5"), ("untextable", "{'error': 'ValueError: no text for this result'}")])
    finally:
        agent.close()
    assert episode_tokens(episodes, 0)[0] == episode
    assert episodes.tool_calls_B.tolist() == [2, 2] and episodes.tool_failures_B.tolist() == [1, 1]


def test_every_row_gets_its_own_environment_instance_and_reward(path, tokenizer):
    envs = Environments(resolve_factories(trl_tools.IncrementEnv))
    agent = Agent(environments=envs, max_episode_tokens=160)
    call = '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'
    instance = trl_tools.IncrementEnv()
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", call), ("tool", [("increment", "2")]),
                                                               ("model", "done")],
                                   instance=instance, observation=instance.reset())
    assert tokenizer.decode(prompt).count("The counter starts at 0.") == 1       # reset's text, after the prompt
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    for _ in range(2):                      # pooled instances are reset: the second rollout counts from 0 again
        episodes = roll(agent, model, tokenizer, [EXAMPLE] * 8)
        assert len({id(i) for i in episodes.instances}) == 8
        assert episodes.env_rewards["IncrementEnv"].tolist() == [2.0] * 8        # shared instances would add up
        assert episode_tokens(episodes, 5)[0] == episode


def test_max_tool_calling_iterations_stops_the_calls(path, tokenizer):
    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=256, max_iterations=1)
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", CALL), ("tool", [("add", "5")]),
                                                               ("model", CALL)])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    episodes = roll(agent, model, tokenizer, [EXAMPLE] * 2)
    assert episode_tokens(episodes, 0)[0] == episode                   # the second call is not run
    assert episodes.tool_calls_B.tolist() == [1, 1] and episodes.turns_B.tolist() == [2, 2]


def test_the_episode_token_limit_drops_results_that_do_not_fit(path, tokenizer, caplog):
    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=80)
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", CALL), ("tool", [("add", "5")]),
                                                               ("model", "5")])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    episodes = roll(agent, model, tokenizer, [EXAMPLE] * 2, max_new_tokens=80)
    tokens, mask = episode_tokens(episodes, 0)
    assert tokens == episode[:len(tokenizer(CALL)["input_ids"]) + 1] and all(mask)   # TRL: results rolled back
    assert episodes.hit_limit_B.tolist() == [True, True] and episodes.metrics()["episodes/hit_token_limit"] == 2
    assert "2 of 2 episodes reached rollout.max_episode_tokens=80" in caplog.text


def test_a_result_far_past_the_episode_limit_ends_it_untokenized(path, tokenizer, monkeypatch):
    """A 20 MB tool result is known to overflow the episode from its size: the episode ends (TRL's rollback)
    without the result being chat-templated and tokenized."""
    agent = Agent(load_tools([trl_tools.huge]), max_episode_tokens=120)
    call = '<tool_call>{"name": "huge", "arguments": {"x": 1}}</tool_call>'
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", call), ("tool", [("huge", "7")]),
                                                               ("model", "5")])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    rendered = []
    real = Agent.suffix_ids
    monkeypatch.setattr(Agent, "suffix_ids", staticmethod(
        lambda tokenizer, messages: rendered.append(len(messages[0]["content"])) or real(tokenizer, messages)))
    episodes = roll(agent, model, tokenizer, [EXAMPLE], max_new_tokens=80)
    assert episodes.hit_limit_B.tolist() == [True]
    assert episode_tokens(episodes, 0)[0] == episode[:len(tokenizer(call)["input_ids"]) + 1]
    assert rendered == []


def test_the_kept_kv_cache_gives_the_log_probs_of_a_whole_forward_pass(path, tokenizer):
    """With attention on (the logits depend on the context a little), the episode's log-probs with the cache
    kept across turns equal those of re-prefilling every turn and those of one forward pass over the episode."""
    from jaxcore.grpo.step import policy_logps

    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=200)
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", CALL), ("tool", [("add", "5")]),
                                                               ("model", CALL), ("tool", [("add", "5")]),
                                                               ("model", "5")])
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id, attention=0.3, gain=1.5)
    examples = [EXAMPLE, Example("What is 2 + 3?!", answer=5)]       # rows of two lengths: holes in the cache
    kept = roll(agent, model, tokenizer, examples, max_new_tokens=72)
    again = roll(agent, model, tokenizer, examples, max_new_tokens=72, reuse_cache=False)
    tokens, mask = episode_tokens(kept, 0)
    assert tokens == episode and episode_tokens(again, 0)[0] == episode
    n = len(tokens)
    np.testing.assert_allclose(np.asarray(kept.result.logprobs), np.asarray(again.result.logprobs), atol=2e-5)
    ids = np.concatenate([kept.prompt_ids_BT[0], tokens])[None]
    attention = np.concatenate([kept.prompt_mask_BT[0], np.ones(n, np.int32)])[None]
    full = np.asarray(policy_logps(model, ids, attention)[0])[0, -n:]
    logprobs = np.asarray(kept.result.logprobs)[0, :n]
    model_tokens = np.array(mask) == 1
    np.testing.assert_allclose(logprobs[model_tokens], full[model_tokens], atol=2e-5)
    assert np.ptp(logprobs[model_tokens]) > 1e-4            # the context matters: a wrong cache would show


class TroubledEnv(trl_tools.IncrementEnv):
    """IncrementEnv whose reset raises or hangs for some questions, and whose constructor fails past `limit`
    instances (a sandbox service out of capacity)."""

    built, limit = 0, 99

    def __init__(self):
        type(self).built += 1
        if type(self).built > type(self).limit:
            raise RuntimeError("no sandbox left")

    def reset(self, **kwargs) -> str | None:
        if kwargs["prompt"].endswith("."):
            raise RuntimeError("sandbox down")
        if kwargs["prompt"].endswith(";"):
            time.sleep(30)
        return super().reset(**kwargs)


def test_an_environment_that_fails_to_build_or_reset_fails_its_row_only(path, tokenizer, caplog):
    """A reset that raises or hangs past the call timeout, or a constructor that raises when the pool grows: that
    row's episode is empty and its environment reward a counted failure; the other rows run as usual. A
    constructor that raises when the run starts is one line."""
    TroubledEnv.built, TroubledEnv.limit = 0, 3           # the run's first instance (row 0), rows 1-2; row 3 fails
    envs = Environments(resolve_factories(TroubledEnv))
    agent = Agent(environments=envs, max_episode_tokens=160, timeout_s=1.0)
    call = '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'
    instance = trl_tools.IncrementEnv()
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", call), ("tool", [("increment", "2")]),
                                                               ("model", "done")],
                                   instance=instance, observation=instance.reset())
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    rows = [EXAMPLE, Example("What is 2 + 3.", answer=5), Example("What is 2 + 3;", answer=5), EXAMPLE]
    began = time.monotonic()
    episodes = roll(agent, model, tokenizer, rows)
    assert time.monotonic() - began < 25                      # the hung reset was given up after the timeout
    assert episode_tokens(episodes, 0)[0] == episode
    assert np.asarray(episodes.result.lengths)[1:].tolist() == [0, 0, 0]
    assert episodes.env_rewards["TroubledEnv"][0] == 2.0 and np.isnan(episodes.env_rewards["TroubledEnv"][1:]).all()
    assert episodes.env_reward_failures == {"TroubledEnv": 3}
    assert "sandbox down" in caplog.text and "timed out" in caplog.text and "no sandbox left" in caplog.text
    TroubledEnv.built, TroubledEnv.limit = 0, 0
    with pytest.raises(TaskError, match=r"^environment_factory: building an instance raised RuntimeError: no sandbox "
                                        r"left$"):
        Environments(resolve_factories(TroubledEnv))


def test_a_repetition_penalty_reaches_the_episodes_turns(path, tokenizer):
    """The engine's turns draw with the rollout's repetition penalty over the episode so far: a greedy first turn
    equals `generate`'s with the same penalty over the same prompt (and differs from an unpenalized one)."""
    import dataclasses

    import jaxcore
    from jaxcore.inference.generate import generate

    model = jaxcore.load_hf(path)
    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=40)
    rollout = RolloutConfig(max_new_tokens=40, temperature=0.0, repetition_penalty=1.8)
    episodes = run_episodes(agent, model, tokenizer, [EXAMPLE], rollout, key=jax.random.key(0),
                            eos_token_ids=(), pad_token_id=tokenizer.pad_token_id)
    plain = run_episodes(agent, model, tokenizer, [EXAMPLE], dataclasses.replace(rollout, repetition_penalty=1.0),
                         key=jax.random.key(0), eos_token_ids=(), pad_token_id=tokenizer.pad_token_id)
    prompt = episodes.prompt_ids_BT[:, episodes.prompt_mask_BT[0].astype(bool)]
    alone = generate(model, prompt, np.ones_like(prompt), max_new_tokens=40, temperature=0.0,
                     repetition_penalty=1.8, pad_token_id=tokenizer.pad_token_id)
    tokens, _ = episode_tokens(episodes, 0)
    assert tokens == np.asarray(alone.tokens)[0, :len(tokens)].tolist() and len(tokens) > 5
    assert tokens != episode_tokens(plain, 0)[0]
