"""The cost of the multi-turn rollout (numbers in docs/examples.md), greedy, one process, on a model that
writes a known three-turn episode (`tests/agents/scripted.py`: a GPT-2 of the "bench" preset, 8 layers of
512, whose residual blocks are zeroed but still computed), so every run has the same turns and tokens:

- the KV cache kept across turns against re-prefilling the whole conversation every turn (the tokens are
  checked to be identical);
- per token, the multi-turn batch against one single-turn `generate` of the same rows, prompts and length
  (EOS ignored, so it writes as many tokens as the longest episode).

    python examples/calculator/cost.py [ROWS]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "agents"))

from scripted import conversation, scripted_model  # noqa: E402

from jaxcore.agents import Agent, run_episodes  # noqa: E402
from jaxcore.agents.tools import load_tools  # noqa: E402
from jaxcore.hf.tiny import write_tiny_checkpoint  # noqa: E402
from jaxcore.hf.tokenization import load_tokenizer  # noqa: E402
from jaxcore.inference.generate import generate  # noqa: E402
from jaxcore.rewards.types import Example  # noqa: E402
from jaxcore.runtime.config import RolloutConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from calculator import CalculatorEnv  # noqa: E402

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 865, "b": 673}}</tool_call>'


def timed(fn, repeats: int = 2):
    """The result and the best wall time of `repeats` calls after one warm-up (compilation) call."""
    out = jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        out = jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - began)
    return out, best


def main(rows: int = 8) -> None:
    path = write_tiny_checkpoint(Path(tempfile.mkdtemp()) / "gpt2", "gpt2", preset="bench")
    tokenizer = load_tokenizer(path)
    agent = Agent(load_tools([CalculatorEnv().multiply]), max_episode_tokens=256)
    example = Example("What is 865 * 673?", answer=582145)
    turns = [("model", CALL), ("tool", [("multiply", "582145")]), ("model", CALL),
             ("tool", [("multiply", "582145")]), ("model", "865 * 673 = 582145")]
    prompt, episode, written = conversation(agent, tokenizer, example, turns)
    model = scripted_model(path, prompt, episode, written, tokenizer.eos_token_id)
    rollout = RolloutConfig(max_new_tokens=96)
    kw = dict(key=None, eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)
    examples = [example] * rows
    kept, t_kept = timed(lambda: run_episodes(agent, model, tokenizer, examples, rollout, **kw))
    again, t_again = timed(lambda: run_episodes(agent, model, tokenizer, examples, rollout, reuse_cache=False, **kw))
    assert np.asarray(kept.result.lengths)[0] == len(episode)
    same = bool(np.array_equal(np.asarray(kept.result.tokens), np.asarray(again.result.tokens)))
    tokens = int(np.asarray(kept.result.lengths).sum())
    longest = int(np.asarray(kept.result.lengths).max())
    ids, mask = kept.prompt_ids_BT, kept.prompt_mask_BT
    single, t_single = timed(lambda: generate(model, ids, mask, max_new_tokens=longest, temperature=0.0,
                                              eos_token_ids=(), pad_token_id=tokenizer.pad_token_id))
    single_tokens = int(np.asarray(single.lengths).sum())
    stats = kept.metrics()
    print(json.dumps({
        "rows": rows, "prompt_tokens": len(prompt), "episode_tokens": len(episode),
        "model_tokens": stats["episodes/model_tokens_mean"], "tool_tokens": stats["episodes/external_tokens_mean"],
        "turns": stats["episodes/turns_mean"], "tool_calls": stats["tools/call_frequency"],
        "kept_cache_s": round(t_kept, 3), "reprefill_s": round(t_again, 3), "same_tokens": same,
        "multi_turn_ms_per_token": round(1e3 * t_kept / tokens, 3),
        "reprefill_ms_per_token": round(1e3 * t_again / tokens, 3),
        "single_turn_s": round(t_single, 3), "single_turn_tokens": single_tokens,
        "single_turn_ms_per_token": round(1e3 * t_single / single_tokens, 3)}, indent=1))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
