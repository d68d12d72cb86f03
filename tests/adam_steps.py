"""Adam steps compared where rounding cannot tell them apart, on any x86-64 CPU and thread count.

Another order of summation (a scanned layer stack, micro-batches, a separate gradient program, another CPU's vector
width or thread count) rounds a gradient by a few units in the last place of the terms it sums. Adam's step
m / (sqrt(v) + eps) divides that error by sqrt(v) + eps, so where a gradient is near 0 the step of a parameter can
move by up to a whole learning rate: parameters after Adam steps cannot share one tolerance. Compared here instead,
one optimiser step at a time from the same state: each step's gradient (read back from the first moment) within
GRAD_RTOL of its leaf's largest, the second moment within what that gradient error allows, and each parameter
within what that gradient error can do to its step (a wrong layer or setting moves gradients by far more).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

GRAD_RTOL = 1e-4        # a gradient's rounding, as a share of its leaf's largest gradient
PARAM_RTOL = 1e-6       # the rounding of the parameter update itself (a few ulps)


@dataclasses.dataclass(frozen=True)
class AdamState:
    """One train state's parameters and Adam moments as numpy copies, by path, and its step count."""

    params: dict[str, np.ndarray]
    mu: dict[str, np.ndarray]
    nu: dict[str, np.ndarray]
    count: int


def flat(tree: Any) -> dict[str, np.ndarray]:
    """Leaves by path, copied (a donated buffer must not change them later)."""
    return {jax.tree_util.keystr(k): np.array(v, copy=True) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def adam_state(state: Any) -> AdamState:
    """`state` (a `TrainState` in the per-layer layout) as an `AdamState`."""
    adam = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
                if isinstance(s, optax.ScaleByAdamState))
    return AdamState(flat(state.params), flat(adam.mu), flat(adam.nu), int(adam.count))


@dataclasses.dataclass(frozen=True)
class Moments:
    """One leaf's Adam moments after step `t` (1 for the first), under optimiser settings `opt`."""

    mu: np.ndarray
    nu: np.ndarray
    t: int
    opt: Any

    @property
    def m_hat(self) -> np.ndarray:
        return self.mu / (1 - self.opt.adam_beta1 ** self.t)

    @property
    def sqrt_v_hat(self) -> np.ndarray:
        return np.sqrt(self.nu / (1 - self.opt.adam_beta2 ** self.t))

    @property
    def size(self) -> np.ndarray:
        """|m_hat| / (sqrt(v_hat) + eps): the size of Adam's step per unit of learning rate."""
        return np.abs(self.m_hat) / (self.sqrt_v_hat + self.opt.adam_epsilon)


def update_error(ours: Moments, theirs: Moments, delta: np.ndarray) -> np.ndarray:
    """The most two steps from the same moments can differ per unit of learning rate when their gradients differ by
    at most `delta`: m_hat moves by c1 * delta and sqrt(v_hat) by at most sqrt(c2) * delta, so the step by
    (c1 + size * sqrt(c2)) * delta over the smaller sqrt(v_hat) + eps (exact, not a first-order estimate), and never
    by more than both steps' sizes together."""
    opt, t = theirs.opt, theirs.t
    c1, c2 = (1 - opt.adam_beta1) / (1 - opt.adam_beta1 ** t), (1 - opt.adam_beta2) / (1 - opt.adam_beta2 ** t)
    denominator = np.minimum(ours.sqrt_v_hat, theirs.sqrt_v_hat) + opt.adam_epsilon
    return np.minimum((c1 + theirs.size * np.sqrt(c2)) * delta / denominator, ours.size + theirs.size)


def gradient(after: AdamState, before: AdamState, key: str, b1: float) -> tuple[np.ndarray, np.ndarray]:
    """The gradient a step applied, read back from its first moment (after clipping, as the moments see it), and
    the rounding of that reading (a few ulps of the moments it subtracts)."""
    mu, mu0 = after.mu[key], before.mu[key]
    return (mu - b1 * mu0) / (1 - b1), 4 * np.finfo(np.float32).eps * (np.abs(mu) + np.abs(mu0)) / (1 - b1)


def assert_same_adam_step(ours: AdamState, theirs: AdamState, before: AdamState, opt: Any, lr: float) -> None:
    """Two Adam(W) steps (`opt`: an `OptimizerConfig`; `lr`: the step's rate) taken from the same state `before`:
    the same gradients to GRAD_RTOL of each leaf's largest, second moments within that, and parameters within what a
    gradient error of that size can do to each one's step."""
    assert ours.count == theirs.count == before.count + 1
    assert ours.params.keys() == theirs.params.keys() == before.params.keys()
    for key in before.params:
        (g_ours, _), (g_theirs, reading) = (gradient(state, before, key, opt.adam_beta1) for state in (ours, theirs))
        delta = GRAD_RTOL * np.abs(g_theirs).max() + reading
        assert_within(g_ours, g_theirs, delta, f"gradient of {key}")
        moments_ours, moments_theirs = (Moments(s.mu[key], s.nu[key], theirs.count, opt) for s in (ours, theirs))
        c2 = (1 - opt.adam_beta2) / (1 - opt.adam_beta2 ** theirs.count)
        assert_within(moments_ours.sqrt_v_hat, moments_theirs.sqrt_v_hat,
                      np.sqrt(c2) * delta + PARAM_RTOL * moments_theirs.sqrt_v_hat, f"sqrt(v_hat) of {key}")
        bound = lr * update_error(moments_ours, moments_theirs, delta) + PARAM_RTOL * np.abs(theirs.params[key])
        assert_within(ours.params[key], theirs.params[key], bound, f"{key} (beyond its gradient's rounding)")


def assert_within(actual: np.ndarray, expected: np.ndarray, tolerance: np.ndarray | float, what: str) -> None:
    """|actual - expected| <= tolerance, entry by entry."""
    apart = np.abs(actual - expected)
    off = ~(apart <= tolerance)
    assert not off.any(), (f"{what}: {off.sum()} of {off.size} entries apart by more than allowed (worst "
                           f"{float(np.max(apart[off])):.3g}, {float(np.max((apart / tolerance)[off])):.3g}x)")


def train_in_lockstep(ours: Any, theirs: Any, batch: Any) -> list[tuple[dict[str, float], dict[str, float]]]:
    """`train_on_rollout(batch)` on two `GRPOLearner`s one optimiser step at a time, `ours` set to `theirs`' state
    (and reference) before each step, each step checked with `assert_same_adam_step`. Returns both metrics per step."""
    sync(ours, theirs)
    (ours_batches, ours_items), (theirs_batches, theirs_items) = (
        learner.step_batches(learner.prepare(batch)) for learner in (ours, theirs))
    metrics = []
    for _ in range(theirs.cfg.grpo.num_iterations):
        for ours_batch, theirs_batch in zip(ours_batches, theirs_batches, strict=True):
            before = sync(ours, theirs)
            metrics.append((ours.step(ours_batch, ours_items), theirs.step(theirs_batch, theirs_items)))
            assert_same_adam_step(adam_state(ours.layer_state()[0]), adam_state(theirs.layer_state()[0]), before,
                                  theirs.cfg.optimizer, metrics[-1][1]["learning_rate"])
            assert_same_reference(ours, theirs)
    return metrics


def sync(ours: Any, theirs: Any) -> AdamState:
    """Load `theirs`' train state and reference (copies) into `ours`; returns that state."""
    state, ref = jax.tree.map(jnp.copy, theirs.layer_state())
    ours.load_layer_state(state, ref)
    return adam_state(state)


def assert_same_reference(ours: Any, theirs: Any) -> None:
    """Reference parameters: equal, up to a mix with the policy (sync_ref_model), within `ours`' policy's distance
    from `theirs`'."""
    (ours_state, ours_ref), (theirs_state, theirs_ref) = ours.layer_state(), theirs.layer_state()
    if theirs_ref is None:
        assert ours_ref is None
        return
    ours_params, theirs_params, ours_ref = flat(ours_state.params), flat(theirs_state.params), flat(ours_ref)
    for key, r in flat(theirs_ref).items():
        apart = np.abs(ours_params[key] - theirs_params[key]) if key in theirs_params else 0.0  # LoRA: the base
        assert_within(ours_ref[key], r, apart + PARAM_RTOL * np.abs(r), f"reference {key}")
