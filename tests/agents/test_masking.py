"""GRPO's loss leaves out the completion tokens the model did not generate (TRL's `completion_mask * tool_mask`):
checked against the loss computed by hand from the policy's log-probs, and against changing those tokens' old
log-probs (which must change nothing)."""

from __future__ import annotations

import dataclasses

import numpy as np

import jaxcore
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.step import batch_objective, build_batch, policy_logps, rollout_metrics


def episodes_batch(model):
    """Two episodes with tool results inside (one left-padded, one shorter), old log-probs near the policy's, and
    TRL's clipped per-token loss computed by hand: (batch, old log-probs, per-token loss, completion mask, tool
    mask)."""
    rng = np.random.default_rng(0)
    b, p, c = 2, 5, 9
    prompt_ids = rng.integers(3, 200, (b, p))
    prompt_mask = np.ones((b, p), np.int32)
    prompt_mask[1, :2] = 0                                     # a left-padded row
    completion_ids = rng.integers(3, 200, (b, c))
    completion_mask = np.ones((b, c), np.int32)
    completion_mask[1, 7:] = 0                                 # a shorter episode
    tool_mask = np.ones((b, c), np.int32)
    tool_mask[0, 2:5] = 0                                      # a tool result inside row 0's episode
    tool_mask[1, 1:3] = 0
    advantages = np.array([1.5, -0.7], np.float32)
    batch = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, (2,), tool_mask)

    # the hand-computed loss: dapo (TRL's default), clipped ratio against shifted old log-probs, over the
    # tokens the model generated only
    ids = np.concatenate([prompt_ids, completion_ids], 1)
    attention = np.concatenate([prompt_mask, completion_mask], 1)
    logp = np.asarray(policy_logps(model, ids, attention)[0])[:, p - 1:]          # scores completion tokens
    old = logp + rng.normal(0, 0.3, logp.shape).astype(np.float32)
    ratio = np.exp(logp - old)
    per_token = -np.minimum(ratio * advantages[:, None], np.clip(ratio, 0.8, 1.2) * advantages[:, None])
    old_BL = np.zeros(batch.completion_mask_BL.shape, np.float32)
    old_BL[:, p - 1:] = old
    return batch, old_BL, per_token, completion_mask, tool_mask


def test_tool_tokens_are_attended_but_out_of_the_loss(tiny_dir):
    model = jaxcore.load_hf(tiny_dir("llama"))
    batch, old_BL, per_token, completion_mask, tool_mask = episodes_batch(model)
    p, trained = 5, completion_mask * tool_mask
    expected = (per_token * trained).sum() / trained.sum()
    cfg = GRPOConfig()
    cfg.rollout.temperature = 1.0
    loss, _ = batch_objective(model, batch.replace(old_logp_BL=old_BL), cfg)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert np.asarray(batch.attention_mask_BT)[:, p:].tolist() == completion_mask.tolist()   # still attended

    # the old log-probs of tool tokens do not matter; those of a generated token do
    moved = old_BL.copy()
    moved[0, p - 1 + 3] += 5.0
    assert float(batch_objective(model, batch.replace(old_logp_BL=moved), cfg)[0]) == float(loss)
    moved[0, p - 1 + 6] += 5.0
    assert float(batch_objective(model, batch.replace(old_logp_BL=moved), cfg)[0]) != float(loss)
    # TRL counts only the model's tokens as the completion's length, and in num_tokens (prompt + sum(tool_mask))
    metrics = rollout_metrics(batch)
    assert metrics["completions/mean_length"] == trained.sum(1).mean()
    prompt_mask = np.asarray(batch.attention_mask_BT)[:, :p]
    trl_tokens = sum(int(prompt_mask[r].sum()) + int(tool_mask[r][completion_mask[r] == 1].sum()) for r in range(2))
    assert metrics["rollout_tokens"] == trl_tokens == 19


def test_dr_grpo_normalises_by_the_episode_length_as_trl(tiny_dir):
    """TRL's dr_grpo divides by max_completion_length, the bound of the whole completion: with tools an
    episode's (rollout.max_episode_tokens), not one turn's (rollout.max_new_tokens); tools given to the Python
    API too (`RolloutConfig.with_agent`)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    batch, old_BL, per_token, completion_mask, tool_mask = episodes_batch(model)
    trained = completion_mask * tool_mask
    cfg = GRPOConfig()
    cfg.grpo.loss_type = "dr_grpo"
    cfg.rollout.temperature, cfg.rollout.max_new_tokens, cfg.rollout.max_episode_tokens = 1.0, 4, 32
    cfg.rollout.tools = ["trl_tools.py:add"]
    expected = (per_token * trained).sum() / (len(trained) * 32)
    np.testing.assert_allclose(float(batch_objective(model, batch.replace(old_logp_BL=old_BL), cfg)[0]), expected,
                               rtol=1e-5)
    cfg.rollout = dataclasses.replace(cfg.rollout, tools=[]).with_agent()        # tools given to the Python API
    np.testing.assert_allclose(float(batch_objective(model, batch.replace(old_logp_BL=old_BL), cfg)[0]), expected,
                               rtol=1e-5)
