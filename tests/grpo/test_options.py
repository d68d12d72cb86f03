"""GRPO learner options: TRL's Adam knobs reach the optimiser, and a skipped (non-finite) step never
triggers a reference-model sync."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adam_steps import GRAD_RTOL, PARAM_RTOL, adam_state, assert_within

import jaxcore
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import loss_and_grads


def flat(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_adam_knobs_reach_the_optimizer(path, batch, grpo_job):
    """Two learner steps with non-default adam_beta1/adam_beta2/adam_epsilon/weight_decay and a linear
    schedule equal AdamW written out in numpy (the second step is where beta1/beta2 show: the first
    update of a bias-corrected Adam is g / (|g| + eps) whatever the betas). The moments are held to the gradient
    of a separate program (its rounding is not Adam's to magnify), the parameters to the step's own moments."""
    cfg = grpo_job(loss_type="dapo", learning_rate=1e-2, total_steps=4, adam_beta1=0.5, adam_beta2=0.7,
                   adam_epsilon=1e-3, weight_decay=0.1, max_grad_norm=0.0, max_completion_length=8)
    defaults = GRPOConfig().optimizer
    assert (defaults.adam_beta1, defaults.adam_beta2, defaults.adam_epsilon) == (0.9, 0.999, 1e-8)   # TRL/HF's
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)

    opt = cfg.optimizer
    b1, b2, eps, wd = opt.adam_beta1, opt.adam_beta2, opt.adam_epsilon, opt.weight_decay
    prepared = learner.prepare(batch)
    for t, lr in ((1, 1e-2), (2, 1e-2 * 3 / 4)):                  # linear decay to 0 at total_steps = 4
        _, _, grads = loss_and_grads(learner.model, prepared, cfg)
        g = flat(grads)
        before = adam_state(learner.layer_state()[0])             # per layer, whatever layout training uses
        metrics = learner.step(prepared)
        assert metrics["learning_rate"] == pytest.approx(lr, rel=1e-6)
        after = adam_state(learner.layer_state()[0])
        assert after.count == t
        for k, p0 in before.params.items():
            delta = GRAD_RTOL * np.abs(g[k]).max()                 # the two gradient programs' rounding
            m, v = after.mu[k], after.nu[k]
            assert_within(m, b1 * before.mu[k] + (1 - b1) * g[k], (1 - b1) * delta + PARAM_RTOL * np.abs(m),
                          f"step {t} first moment of {k}")
            assert_within(v, b2 * before.nu[k] + (1 - b2) * g[k] ** 2, (1 - b2) * (2 * np.abs(g[k]) + delta) * delta
                          + PARAM_RTOL * v, f"step {t} second moment of {k}")
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            decay = wd * p0 if p0.ndim >= 2 else 0.0              # HF/TRL: no decay on biases and norms
            np.testing.assert_allclose(after.params[k], p0 - lr * (m_hat / (np.sqrt(v_hat) + eps) + decay),
                                       rtol=1e-5, atol=1e-7, err_msg=f"step {t} {k}")
    p = after.params

    # The same two steps under the default knobs land elsewhere (the test can tell them apart).
    plain = GRPOLearner(jaxcore.load_hf(path), dataclasses.replace(cfg, optimizer=dataclasses.replace(
        opt, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0)))
    plain.step(prepared)
    plain.step(prepared)
    other = flat(plain.to_layer_layout(plain.state.params))
    assert max(np.abs(other[k] - p[k]).max() for k in p) > 1e-4


def test_skipped_step_does_not_sync_the_reference(path, tiny_dir, batch, grpo_job):
    """TRL syncs on_step_end at global_step % ref_model_sync_steps == 0. A non-finite step is skipped
    here and `state.step` stays put, so it must not sync: not at step 0, and not again at step 2."""
    cfg = grpo_job(beta=0.04, learning_rate=1e-2, max_completion_length=8, sync_ref_model=True,
                   ref_model_sync_steps=2, ref_model_mixup_alpha=0.6)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg, ref_model=jaxcore.load_hf(tiny_dir("llama", seed=1)))
    prepared = learner.prepare(batch)
    poisoned = prepared.replace(advantages_B=jnp.full_like(prepared.advantages_B, jnp.nan))

    def ref_leaves():
        return [np.asarray(x) for x in jax.tree.leaves(learner.ref[1])]

    ref0 = ref_leaves()
    assert max(np.abs(r - p).max() for r, p in zip(ref0, jax.tree.leaves(learner.state.params))) > 1e-3
    skipped = learner.step(poisoned)                              # step 0, skipped: 0 % 2 == 0, no sync
    assert not np.isfinite(skipped["loss"]) and int(learner.state.step) == 0
    for x, y in zip(ref0, ref_leaves(), strict=True):
        np.testing.assert_array_equal(x, y)

    learner.step(prepared)                                        # step 1: no sync
    learner.step(prepared)                                        # step 2: sync
    assert int(learner.state.step) == 2
    ref2 = ref_leaves()
    for r0, p, r in zip(ref0, jax.tree.leaves(learner.state.params), ref2, strict=True):
        np.testing.assert_allclose(r, 0.6 * np.asarray(p) + 0.4 * r0, rtol=1e-6, atol=1e-7)

    learner.step(poisoned)                                        # still step 2: must not mix again
    assert int(learner.state.step) == 2
    for x, y in zip(ref2, ref_leaves(), strict=True):
        np.testing.assert_array_equal(x, y)
    learner.step(prepared)                                        # step 3: no sync
    for x, y in zip(ref2, ref_leaves(), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("target, moved", [(100.0, "up"), (0.2, "down")])
def test_adaptive_entropy_follows_trls_controller(path, batch, grpo_job, target, moved):
    """TRL's use_adaptive_entropy over two optimiser steps of two micro-batches each: the first step applies no
    bonus (the last step's entropy is unknown: inf); after each step the coefficient moves by entropy_coef_delta,
    up when the step's token-weighted entropy is at or below entropy_target, down otherwise, within
    [entropy_coef_min, entropy_coef_max]; the second step's loss is the static loss with the coefficient the
    controller chose (0 when the last entropy was above the target)."""
    settings = dict(loss_type="dapo", learning_rate=1e-3, max_completion_length=8, gradient_accumulation_steps=2,
                    max_grad_norm=0.0)
    adaptive = grpo_job(**settings, use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.04,
                        entropy_coef_min=0.07, entropy_coef_max=0.13, entropy_target=target)
    learner = GRPOLearner(jaxcore.load_hf(path), adaptive)
    prepared = learner.prepare(batch)
    mask = np.asarray(prepared.completion_mask_BL, bool)[:, prepared.completion_start:]

    def window_entropy(model) -> float:
        """TRL's: the entropy of every active token of the step (both micro-batches), token-weighted."""
        from jaxcore.grpo.step import policy_logps

        entropy = np.asarray(policy_logps(model, prepared.input_ids_BT, prepared.attention_mask_BT,
                                          start=prepared.completion_start)[1])
        return float(entropy[mask].mean())

    def static_loss(coef: float) -> float:
        """The loss of this step from the same state under a fixed entropy_coef."""
        static = GRPOLearner(jaxcore.load_hf(path), grpo_job(**settings, entropy_coef=coef))
        static.state = dataclasses.replace(jax.tree.map(jnp.copy, learner.state), entropy_control=None)
        return static.step(prepared)["loss"]

    expected_loss = static_loss(0.0)
    entropy = window_entropy(learner.model)
    first = learner.step(prepared)
    assert first["loss"] == pytest.approx(expected_loss, rel=1e-5)
    coef = min(0.1 + 0.04, 0.13) if entropy <= target else max(0.1 - 0.04, 0.07)
    assert first["entropy_coef"] == pytest.approx(coef) and ("up" if coef > 0.1 else "down") == moved
    np.testing.assert_allclose(np.asarray(learner.state.entropy_control), [coef, entropy], rtol=1e-5)

    applied = coef if entropy <= target else 0.0
    expected_loss, entropy = static_loss(applied), window_entropy(learner.model)
    second = learner.step(prepared)
    assert second["loss"] == pytest.approx(expected_loss, rel=1e-5)
    coef = min(coef + 0.04, 0.13) if entropy <= target else max(coef - 0.04, 0.07)
    assert second["entropy_coef"] == pytest.approx(coef)
