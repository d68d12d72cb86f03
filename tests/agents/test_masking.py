"""GRPO's loss leaves out the completion tokens the model did not generate (TRL's `completion_mask * tool_mask`):
checked against the loss computed by hand from the policy's log-probs, and against changing those tokens' old
log-probs (which must change nothing)."""

from __future__ import annotations

import numpy as np

import jaxcore
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.step import batch_objective, build_batch, policy_logps, rollout_metrics


def test_tool_tokens_are_attended_but_out_of_the_loss(tiny_dir):
    model = jaxcore.load_hf(tiny_dir("llama"))
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
    trained = completion_mask * tool_mask
    expected = (per_token * trained).sum() / trained.sum()

    cfg = GRPOConfig()
    cfg.rollout.temperature = 1.0
    old_BL = np.zeros(batch.completion_mask_BL.shape, np.float32)
    old_BL[:, p - 1:] = old
    loss, _ = batch_objective(model, batch.replace(old_logp_BL=old_BL), cfg)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert np.asarray(batch.attention_mask_BT)[:, p:].tolist() == completion_mask.tolist()   # still attended

    # the old log-probs of tool tokens do not matter; those of a generated token do
    moved = old_BL.copy()
    moved[0, p - 1 + 3] += 5.0
    assert float(batch_objective(model, batch.replace(old_logp_BL=moved), cfg)[0]) == float(loss)
    moved[0, p - 1 + 6] += 5.0
    assert float(batch_objective(model, batch.replace(old_logp_BL=moved), cfg)[0]) != float(loss)
    # TRL counts only the model's tokens as the completion's length
    assert rollout_metrics(batch)["completions/mean_length"] == trained.sum(1).mean()
