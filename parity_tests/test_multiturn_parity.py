"""A multi-turn episode's log-probs equal transformers' forward on the contiguous prompt + completion, for every
family and sliding window, with the KV cache kept across turns and rows whose turns end at different lengths (so
the cache holds invalid slots inside each row: after a row's EOS while the others go on, and the left padding of
every appended chunk)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import jaxcore
from jaxcore.agents import Agent, ToolCall, engine, run_episodes
from jaxcore.agents.tools import load_tools
from jaxcore.hf.tokenization import load_tokenizer
from jaxcore.rewards.types import Example
from jaxcore.runtime.config import RolloutConfig
from torchref.model import load_reference


def ping() -> str:
    """Answer every call with a fixed text.

    Returns:
        The text appended as the tool's message.
    """
    return "pong!"


def reference_logprobs(path, prompt: list[int], completion: list[int]) -> np.ndarray:
    """transformers' log-prob of each completion token after the contiguous prompt + completion before it."""
    model = load_reference(path)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].numpy()


CASES = [("llama", {}), ("qwen2", {}), ("qwen3", {}), ("gpt2", {}),
         ("gemma3", {"sliding_window": 4}), ("gemma3", {"sliding_window": 16})]


@pytest.mark.parametrize("family,options", CASES, ids=["llama", "qwen2", "qwen3", "gpt2", "gemma3-w4", "gemma3-w16"])
@pytest.mark.parametrize("reuse_cache", [True, False], ids=["kept-cache", "prefill-each-turn"])
def test_episode_logprobs_equal_transformers_on_the_contiguous_sequence(tiny_dir, monkeypatch, family, options,
                                                                        reuse_cache):
    path = tiny_dir(family, max_pos=2048, **options)      # room for the tools' description
    model, tokenizer = jaxcore.load_hf(path), load_tokenizer(path)
    # every turn calls the tool (five rounds); half of the vocabulary ends a turn, so sampled turns end at
    # different lengths in different rows
    monkeypatch.setattr(engine, "turn_calls", lambda tokenizer, message, ids: [ToolCall("ping", {})])
    agent = Agent(load_tools([ping]), max_iterations=5, max_episode_tokens=120)
    eos = tuple(range(3, model.config.vocab_size, 2))
    examples = [Example("Say something.", answer=""), Example("Say something else, please!", answer=""),
                Example("Hi", answer="")]
    rollout = RolloutConfig(max_new_tokens=12, temperature=1.0)
    episodes = run_episodes(agent, model, tokenizer, examples, rollout, key=jax.random.key(3), eos_token_ids=eos,
                            pad_token_id=tokenizer.pad_token_id, reuse_cache=reuse_cache)
    lengths = np.asarray(episodes.result.lengths)
    tokens, logprobs = np.asarray(episodes.result.tokens), np.asarray(episodes.result.logprobs)
    turn_lengths = set()
    for row in range(len(examples)):
        n = int(lengths[row])
        completion, from_model = tokens[row, :n].tolist(), episodes.model_mask_BE[row, :n] == 1
        prompt = episodes.prompt_ids_BT[row][episodes.prompt_mask_BT[row] == 1].tolist()
        expected = reference_logprobs(path, prompt, completion)
        np.testing.assert_allclose(logprobs[row, :n][from_model], expected[from_model], atol=2e-5,
                                   err_msg=f"row {row}")
        runs = np.split(from_model, np.flatnonzero(np.diff(from_model.astype(int))) + 1)
        turn_lengths |= {len(r) for r in runs if r[0]}
        assert episodes.turns_B[row] >= 2 and n > 2 * options.get("sliding_window", 8)
    assert len(turn_lengths) >= 3           # turns of several lengths: holes inside the kept cache's rows
