"""GRPO with LoRA adapters (the reference is the frozen base, no copy; a short run raises the held-out
reward), steps_per_generation, and TR-DPO reference sync."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.grpo.advantages import compute_advantages
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import batch_objective, build_batch
from jaxcore.hf import peft
from jaxcore.inference.generate import generate
from jaxcore.model import lora

LORA = lora.LoRAConfig(rank=4, alpha=8.0, target_modules=("all-linear",))


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_lora_learner_trains_adapters_only_and_references_the_base(path, batch, grpo_job):
    cfg = grpo_job(loss_type="dapo", beta=0.04, learning_rate=1e-2, max_completion_length=8, lora=LORA)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)
    base_before = leaves(learner.frozen)
    assert learner.ref[1] is learner.frozen                       # no second copy of the weights
    assert set(learner.to_layer_layout(learner.state.params)) == set(peft.target_paths(learner.model, LORA))
    first = learner.train_on_rollout(batch)[0]
    second = learner.train_on_rollout(batch)[0]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and second["kl"] > 1e-6   # b = 0 at start: policy == base
    for x, y in zip(base_before, leaves(learner.frozen), strict=True):
        np.testing.assert_array_equal(x, y)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    np.testing.assert_allclose(np.asarray(learner.export_model()(ids, attention_mask=mask)),
                               np.asarray(learner.model(ids, attention_mask=mask)), atol=2e-5)
    with pytest.raises(ValueError, match="sync_ref_model"):
        grpo_job(beta=0.04, sync_ref_model=True, lora=LORA)


def test_bf16_base_with_dropout_learns(path, batch, grpo_job):
    cfg = grpo_job(loss_type="grpo", learning_rate=1e-2, max_completion_length=8,
                   lora=lora.LoRAConfig(rank=2, dropout=0.1, base_dtype="bfloat16"))
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(learner.frozen))
    metrics = [learner.train_on_rollout(batch)[0] for _ in range(3)]
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics)


def test_lora_dropout_acts_in_training_only(path, batch, grpo_job):
    """With non-zero adapters, dropout 0.1 changes the training loss (same key as a dropout-0 learner)
    and the step, while the deterministic forward (no key: `learner.model`, old log-probs) equals dropout 0.
    (beta != 0 so the loss value depends on the log-probs: with mu = 1 the policy term is -mean(A).)"""
    learners = {}
    for p in (0.0, 0.1):
        cfg = grpo_job(loss_type="grpo", beta=0.04, learning_rate=1e-2, max_completion_length=8,
                       lora=lora.LoRAConfig(rank=2, dropout=p, target_modules=("all-linear",)))
        learner = GRPOLearner(jaxcore.load_hf(path), cfg)
        params = {k: {"a": ab["a"], "b": 0.2 * jax.random.normal(jax.random.fold_in(jax.random.key(7), i),
                                                                  ab["b"].shape)}
                  for i, (k, ab) in enumerate(sorted(learner.state.params.items()))}
        learner.state = dataclasses.replace(learner.state, params=params)
        learners[p] = learner
    prepared = learners[0.0].prepare(batch)
    key = jax.random.key(3)

    def loss(p, key):
        learner = learners[p]
        model = learner.build(learner.state.params, learner.frozen, key)
        return float(batch_objective(model, prepared, learner.cfg)[0])

    assert loss(0.0, key) == loss(0.0, None)                      # dropout 0 ignores the key
    assert abs(loss(0.1, key) - loss(0.0, key)) > 1e-4 * abs(loss(0.0, key))
    assert loss(0.1, key) != loss(0.1, jax.random.key(4))         # a fresh mask per key
    assert loss(0.1, None) == pytest.approx(loss(0.0, key), rel=1e-6)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    np.testing.assert_allclose(np.asarray(learners[0.1].model(ids, attention_mask=mask)),
                               np.asarray(learners[0.0].model(ids, attention_mask=mask)), rtol=1e-6, atol=1e-6)
    deterministic = loss(0.1, None)
    steps = {p: learner.step(prepared) for p, learner in learners.items()}     # the step draws a dropout key
    assert steps[0.0]["loss"] == pytest.approx(deterministic, rel=1e-5)
    assert abs(steps[0.1]["loss"] - steps[0.0]["loss"]) > 1e-4 * abs(steps[0.0]["loss"])


def test_steps_per_generation_splits_the_rollout(path, batch, grpo_job):
    """Two optimiser steps per rollout: old log-probs are stored (first step ratio 1), each step sees half
    the rows, and dapo divides by half the rollout's tokens (TRL's num_items * gas / steps_per_generation)."""
    cfg = grpo_job(loss_type="dapo", learning_rate=1e-2, max_completion_length=8, steps_per_generation=2,
                   epsilon=0.01)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)
    assert learner.cfg.old_logp_source != "none"
    steps = learner.train_on_rollout(batch)
    assert len(steps) == 2 and learner.cfg.grpo.steps_per_rollout == 2
    tokens = float(np.asarray(batch.completion_mask_BL).sum())
    assert steps[0]["loss_tokens"] == steps[1]["loss_tokens"] == tokens / 2
    assert steps[0]["clip_ratio/region_mean"] == 0.0 < steps[1]["clip_ratio/region_mean"]
    with pytest.raises(ValueError, match="multiple"):
        grpo_job(steps_per_generation=3, gradient_accumulation_steps=2)


def test_sync_ref_model_mixes_every_n_steps(path, batch, grpo_job):
    cfg = grpo_job(beta=0.04, learning_rate=1e-2, max_completion_length=8, sync_ref_model=True,
                   ref_model_sync_steps=2, ref_model_mixup_alpha=0.6)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)
    initial = leaves(learner.ref[1])
    learner.train_on_rollout(batch)
    for x, y in zip(initial, leaves(learner.ref[1]), strict=True):
        np.testing.assert_array_equal(x, y)                     # step 1: not a sync step
    learner.train_on_rollout(batch)
    policy = leaves(learner.state.params)
    for r0, p, r in zip(initial, policy, leaves(learner.ref[1]), strict=True):
        np.testing.assert_allclose(r, 0.6 * p + 0.4 * r0, rtol=1e-6, atol=1e-7)
    assert max(np.abs(r - r0).max() for r, r0 in zip(leaves(learner.ref[1]), initial)) > 1e-4
    with pytest.raises(ValueError, match="beta"):
        grpo_job(sync_ref_model=True)


def held_out_reward(model, prompts, half: int) -> float:
    result = generate(model, prompts, np.ones_like(prompts), max_new_tokens=6, temperature=1.0,
                      num_return_sequences=4, key=jax.random.key(123))
    return float((np.asarray(result.tokens) < half).mean())


def test_lora_grpo_raises_held_out_reward(path, grpo_job):
    """Reward: the share of completion tokens in the lower half of the vocabulary (about 0.5 for the
    random tiny model). A short LoRA GRPO run raises it on held-out prompts."""
    model = jaxcore.load_hf(path)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    train_prompts, held_out = rng.integers(0, vocab, (8, 5)), rng.integers(0, vocab, (16, 5))
    cfg = grpo_job(loss_type="dapo", learning_rate=0.1, max_completion_length=6, lr_schedule="constant",
                   lora=LORA)
    learner = GRPOLearner(model, cfg)
    before = held_out_reward(learner.model, held_out, vocab // 2)
    for epoch in range(20):
        prompts = train_prompts[rng.permutation(8)[:4]]
        result = generate(learner.model, prompts, np.ones_like(prompts), max_new_tokens=6, temperature=1.0,
                          num_return_sequences=8, key=jax.random.key(epoch))
        tokens = np.asarray(result.tokens)
        rewards = (tokens < vocab // 2).mean(1)
        batch = build_batch(np.repeat(prompts, 8, 0), np.ones((32, 5), np.int32), tokens, np.ones_like(tokens),
                            np.asarray(compute_advantages(rewards, 8)))
        learner.train_on_rollout(batch)
    after = held_out_reward(learner.model, held_out, vocab // 2)
    print(f"held-out reward {before:.3f} -> {after:.3f}")
    assert after > before + 0.15
