"""A multi-turn episode reaches the reward functions as TRL's message list, `[assistant, tool, ..., assistant]`: each
assistant turn parsed by TRL 1.16's own `parse_response` where the tokenizer has a response template (the calls run
with the arguments that parse types, as TRL runs them), each tool result as the `tool` message TRL appends; so a
reward reading `completion[-1]["content"]` reads the model's last turn, not a tool's output."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import trl_tools  # noqa: E402
from scripted import conversation, scripted_model  # noqa: E402

from jaxcore.agents import Agent, run_episodes  # noqa: E402
from jaxcore.agents.messages import assistant_message  # noqa: E402
from jaxcore.agents.tools import load_tools, tool_schema  # noqa: E402
from jaxcore.rewards import Example, Scorer  # noqa: E402
from jaxcore.rewards.user_functions import resolve_rewards  # noqa: E402
from jaxcore.runtime.config import RolloutConfig  # noqa: E402
from jaxcore.runtime.rollout import score_rows  # noqa: E402

EXAMPLE = Example([{"role": "user", "content": "What is 2 + 3?"}], answer=5, columns={"answer": 5})


@pytest.fixture(scope="module")
def path(tiny_dir) -> Path:
    return tiny_dir("gpt2", max_pos=4096)


@pytest.fixture(scope="module")
def plain_tokenizer(path):
    """The byte tokenizer with its own chat template: no response template (TRL runs no tools with it)."""
    from jaxcore.hf.tokenization import load_tokenizer

    return copy.deepcopy(load_tokenizer(path))


@pytest.fixture(scope="module")
def qwen_path(path, tmp_path_factory) -> Path:
    """The tiny GPT-2 with Qwen's turn tokens added (<|im_start|>, and <|im_end|> its EOS) and Qwen 2.5's chat
    template (prefix-preserving, as multi-turn needs): a tokenizer TRL's `add_response_schema` knows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    out = tmp_path_factory.mktemp("qwen-chat")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token, tokenizer.chat_template = "<|im_end|>", qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_path):
    """Its tokenizer with the response template TRL gives it (`add_response_schema`)."""
    from trl.chat_template_utils import add_response_schema

    from jaxcore.hf.tokenization import load_tokenizer

    return add_response_schema(copy.deepcopy(load_tokenizer(qwen_path)))


def episode_of(path, tokenizer, turns):
    """The scripted model's episode for `turns` on two rows: (prompt ids, [ids of each turn], episodes)."""
    agent = Agent(load_tools([trl_tools.add]), max_episode_tokens=400)
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, turns)
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    rollout = RolloutConfig(max_new_tokens=120, temperature=1.0)
    episodes = run_episodes(agent, model, tokenizer, [EXAMPLE] * 2, rollout, key=jax.random.key(0),
                            eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)
    runs, start = [], 0
    for kind, value in turns:
        ids = (tokenizer(value, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] if kind == "model"
               else agent.suffix_ids(tokenizer, [{"role": "tool", "name": n, "content": c} for n, c in value]))
        runs.append(ids)
        start += len(ids)
    assert episodes.result.tokens[0, :start].tolist() == episode       # the script ran
    return prompt, runs, episodes


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": "3"}}\n</tool_call>'


@pytest.mark.parametrize("text", [CALL, "The sum is 5.", "Let me add.\n" + CALL, CALL[:30],
                                  "<think>\nadding\n</think>\n\n5", ""], ids=["call", "answer", "text-and-call",
                                                                             "cut-call", "thinking", "eos-only"])
def test_an_assistant_turn_is_trls_parse_response(qwen_tokenizer, text):
    from trl.chat_template_utils import parse_response

    schemas = [tool_schema(trl_tools.add)]
    prefix = qwen_tokenizer(qwen_tokenizer.apply_chat_template(EXAMPLE.prompt, tools=schemas, tokenize=False,
                                                                 add_generation_prompt=True),
                             add_special_tokens=False)["input_ids"]
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"] + [qwen_tokenizer.eos_token_id]
    assert assistant_message(qwen_tokenizer, ids, prefix, schemas) == parse_response(qwen_tokenizer, ids,
                                                                                       prefix=prefix, tools=schemas)


def test_an_episode_is_trls_message_list_with_a_response_template(qwen_path, qwen_tokenizer):
    """The call's "3" is typed 3 by the parse (TRL calls add(a=2, b=3): the result 5, not an error), and the
    completion is [parse_response(turn 1), the tool message, parse_response(turn 2)], each parsed after what came
    before it, as TRL's `_tool_call_loop` builds it."""
    from trl.chat_template_utils import parse_response

    tokenizer = qwen_tokenizer
    prompt, (turn1, suffix, turn2), episodes = episode_of(qwen_path, tokenizer, [
        ("model", CALL), ("tool", [("add", "5")]), ("model", "The sum is 5.")])
    schemas = [tool_schema(trl_tools.add)]
    expected = [parse_response(tokenizer, turn1, prefix=prompt, tools=schemas),
                {"role": "tool", "name": "add", "content": "5"},
                parse_response(tokenizer, turn2, prefix=prompt + turn1 + suffix, tools=schemas)]
    assert expected[0]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}
    assert episodes.messages == [expected, expected]
    assert episodes.tool_failures_B.tolist() == [0, 0]


def test_a_reward_reads_the_last_turn_not_the_tools_output(path, plain_tokenizer):
    """Without a response template (SmolLM2's case; TRL runs no tools there) a turn's calls are jaxcore's parse of
    its `<tool_call>` blocks, in TRL's form, and its content the text around them. The tool's output holds the
    answer too: a reward reading the last message's content sees the model's own final turn only."""
    tokenizer = plain_tokenizer
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _, _, episodes = episode_of(path, tokenizer, [("model", "Adding. " + call), ("tool", [("add", "5")]),
                                                  ("model", "I do not know.")])
    expected = [{"role": "assistant", "content": "Adding.",
                 "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                {"role": "tool", "name": "add", "content": "5"},
                {"role": "assistant", "content": "I do not know."}]
    assert episodes.messages == [expected, expected]
    seen = []

    def says_answer(completions, answer, **kwargs):
        seen.extend(completions)
        for completion in completions:
            completion.append({"role": "assistant", "content": "edited"})     # the next function must not see it
        return [float(str(a) in c[-2]["content"]) for c, a in zip(completions, answer)]

    def also_reads(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    fns, weights = resolve_rewards([says_answer, also_reads], columns=["answer"])
    with Scorer(fns, weights) as scorer:
        scores = score_rows(episodes.result, [EXAMPLE] * 2, tokenizer, scorer, **episodes.scoring())
    assert scores.per_function["says_answer"].tolist() == [0.0, 0.0]       # "5" is only in the tool's output
    assert seen[2:] == [expected, expected]


def test_reward_functions_get_the_prompt_with_the_environments_reset_text(path, plain_tokenizer):
    """TRL appends reset()'s text to the prompt's last message and hands the reward functions that prompt; the
    dataset's row is left as it was."""
    from jaxcore.agents.environments import Environments, resolve_factories

    tokenizer = plain_tokenizer
    agent = Agent(environments=Environments(resolve_factories(trl_tools.IncrementEnv)), max_episode_tokens=160)
    instance = trl_tools.IncrementEnv()
    prompt, episode, written = conversation(agent, tokenizer, EXAMPLE, [("model", "done")], instance=instance,
                                            observation=instance.reset())
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    rows = [EXAMPLE, Example("Count.", answer=0, columns={"answer": 0})]
    episodes = run_episodes(agent, model, tokenizer, rows, RolloutConfig(max_new_tokens=40, temperature=1.0),
                            key=jax.random.key(0), eos_token_ids=(tokenizer.eos_token_id,),
                            pad_token_id=tokenizer.pad_token_id)
    seen = []

    def reads_prompts(prompts, completions, **kwargs):
        seen.extend(prompts)
        return [0.0] * len(prompts)

    fns, weights = resolve_rewards([reads_prompts])
    with Scorer(fns, weights) as scorer:
        score_rows(episodes.result, rows, tokenizer, scorer, **episodes.scoring())
    observation = " The counter starts at 0."
    trl_prompt = EXAMPLE.prompt[:-1] + [{**EXAMPLE.prompt[-1], "content": EXAMPLE.prompt[-1]["content"] + observation}]
    assert seen == [trl_prompt, "Count." + observation]
    assert EXAMPLE.prompt[-1]["content"] == "What is 2 + 3?"
