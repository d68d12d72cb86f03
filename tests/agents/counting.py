"""The counting episode both trainer tests run (`test_es_cli.py`, `test_grpo_resume.py`): a TRL-style tool function
and environment class (`trl_tools.py`, written as TRL's docs write them) and a real jaxcore model that writes a
script (`scripted.py`): it calls the environment's `increment` with a step of 2 or 4 (equally likely: sampling,
or for ES the members' perturbations, pick one), reads the result, answers "done"."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trl_tools
from scripted import conversation, scripted_model

from jaxcore.agents import Agent
from jaxcore.agents.environments import Environments, resolve_factories
from jaxcore.agents.tools import load_tools
from jaxcore.rewards.types import Example

CALL = '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'
TRAIN = [{"prompt": "Count to 2.", "answer": 2}, {"prompt": "Count to 4.", "answer": 4}]
HELD_OUT = [{"prompt": "Count to 6.", "answer": 6}, {"prompt": "Count to 8.", "answer": 8}]


def model_factory(path: Path) -> Callable[[], Any]:
    """Fresh copies of the scripted model (a trainer owns and updates the one it gets)."""
    from jaxcore.hf.tokenization import load_tokenizer

    tokenizer = load_tokenizer(path)
    agent = Agent(load_tools([trl_tools.add]), Environments(resolve_factories(trl_tools.IncrementEnv)))
    instance = trl_tools.IncrementEnv()
    prompt, episode, written = conversation(agent, tokenizer, Example(TRAIN[0]["prompt"]),
                                            [("model", CALL), ("tool", [("increment", "2")]), ("model", "done")],
                                            instance=instance, observation=instance.reset())
    step = len(tokenizer(CALL.split('"step": ')[0] + '"step": ')["input_ids"])
    four = tokenizer("4", add_special_tokens=False)["input_ids"][0]
    return lambda: scripted_model(path, prompt, episode, written, tokenizer.eos_token_id, ties={step: four})


def logged(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
