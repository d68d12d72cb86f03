"""GRPO trains the blocks scanned (`model.scan_layers`, the default): the same steps as training them layer by layer,
checkpoints in the per-layer layout either way, and a train step whose traced and lowered program does not grow
with depth (so neither does the time to make it)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adam_steps import train_in_lockstep

import jaxcore
from jaxcore.bench.grpo import synthetic_batch
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import loss_mask
from jaxcore.hf.tiny import write_tiny_checkpoint
from jaxcore.model import lora


@pytest.fixture(scope="module")
def five_layers(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("five") / "llama", family="llama", preset="tiny", layers=5)


def learners(path, cfg, **kwargs):
    """The same job trained scanned and layer by layer."""
    per_layer = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=False))
    return GRPOLearner(jaxcore.load_hf(path), cfg, **kwargs), GRPOLearner(jaxcore.load_hf(path), per_layer, **kwargs)


def assert_same_state(scanned: GRPOLearner, per_layer: GRPOLearner) -> None:
    """Equal train states and references, bit for bit."""
    (state, ref), (expected, expected_ref) = scanned.layer_state(), per_layer.layer_state()
    assert jax.tree.structure((state, ref)) == jax.tree.structure((expected, expected_ref))
    for a, b in zip(jax.tree.leaves((state, ref)), jax.tree.leaves((expected, expected_ref)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def assert_same_metrics(steps: list[tuple[dict[str, float], dict[str, float]]], rel: float) -> None:
    for ours, theirs in steps:
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=rel, abs=rel / 100)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=rel)


def test_scanned_training_takes_the_per_layer_steps(five_layers, batch, grpo_job):
    """Two rollouts of two optimiser steps each (num_iterations 2: old log-probs; beta: a reference model; AdamW
    with weight decay, which skips norm scales also when they are stacked): each step from the same state is the
    per-layer learner's, to the rounding of another summation order (`adam_steps.train_in_lockstep`)."""
    cfg = grpo_job(loss_type="dapo", beta=0.04, num_iterations=2, learning_rate=1e-2, weight_decay=0.1,
                   max_completion_length=8)
    scanned, per_layer = learners(five_layers, cfg)
    assert scanned.scanned and not per_layer.scanned
    assert "body" in scanned.state.params["blocks"] and 0 in per_layer.state.params["blocks"]
    assert_same_state(scanned, per_layer)                         # stacked from the same checkpoint
    for _ in range(2):
        assert_same_metrics(train_in_lockstep(scanned, per_layer, batch), rel=1e-4)


def test_scanned_lora_with_dropout_drops_what_the_per_layer_model_drops(five_layers, batch, grpo_job):
    cfg = grpo_job(loss_type="grpo", learning_rate=1e-2, max_completion_length=8,
                   lora=lora.LoRAConfig(rank=2, dropout=0.3, target_modules=("all-linear",)))
    scanned, per_layer = learners(five_layers, cfg)
    assert scanned.scanned
    assert_same_state(scanned, per_layer)
    for _ in range(2):
        assert_same_metrics(train_in_lockstep(scanned, per_layer, batch), rel=1e-5)
    assert set(scanned.to_layer_layout(scanned.state.params)) == set(per_layer.state.params)


def test_a_checkpoint_written_per_layer_resumes_a_scanned_learner(five_layers, batch, grpo_job):
    """Checkpoints hold the per-layer layout whatever the training layout, so one saved by either (or by code
    from before scanning) restores into the other, bit for bit, and trains on identically."""
    cfg = grpo_job(loss_type="dapo", beta=0.04, sync_ref_model=True, ref_model_sync_steps=1, learning_rate=1e-2,
                   max_completion_length=8)
    scanned, per_layer = learners(five_layers, cfg)
    per_layer.train_on_rollout(batch)
    state, ref = jax.tree.map(jnp.copy, per_layer.layer_state())      # as restored: arrays of its own
    scanned.load_layer_state(state, ref)
    assert_same_state(scanned, per_layer)
    train_in_lockstep(scanned, per_layer, batch)


def lowered_step_size(tmp_path, layers: int, scan: bool, grpo_job) -> int:
    path = write_tiny_checkpoint(tmp_path / f"l{layers}", family="llama", preset="tiny", layers=layers)
    cfg = grpo_job(loss_type="dapo", max_completion_length=8)
    cfg.model.scan_layers = scan
    model = jaxcore.load_hf(path)
    learner = GRPOLearner(model, cfg)
    batch = learner.prepare(synthetic_batch(model.config.vocab_size, 8, 6, 8, group_size=4, seed=1))
    num_items = loss_mask(batch, False).sum().astype(np.float32)
    return len(learner._step.lower(learner.state, learner.frozen, batch, num_items, None).as_text())


def test_the_train_step_does_not_grow_with_depth(tmp_path, grpo_job):
    """The lowered GRPO step at 32 layers is at most 1.2x its size at 8 (one block traced and lowered whatever the
    depth); layer by layer it grows with every block (3.7x in 32 layers of SmolLM2's shape)."""
    scanned = {layers: lowered_step_size(tmp_path, layers, True, grpo_job) for layers in (8, 32)}
    assert scanned[32] <= 1.2 * scanned[8], scanned
    per_layer = {layers: lowered_step_size(tmp_path, layers, False, grpo_job) for layers in (8, 32)}
    assert per_layer[32] > 2 * per_layer[8], per_layer      # what the test would catch
