"""The comparison of Adam steps that the equality tests use (`tests/adam_steps.py`, issue 49, item 9): it accepts
two AdamW steps whose gradients differ by rounding, which one tolerance on the parameters cannot (another CPU's
summation order put one parameter of the scanned-layers test 2.2e-4 from its per-layer twin, against 1e-4), and it
refuses what the tests are there to catch: a gradient in the wrong place, a wrong setting, an error beyond rounding.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from adam_steps import AdamState, adam_state, assert_same_adam_step

from jaxcore.runtime.optim import OptimizerConfig, apply_step, make_optimizer

OPT = OptimizerConfig("adamw", learning_rate=1e-2, weight_decay=0.1, max_grad_norm=1.0)
SHAPES = {"layer0": (32, 48), "layer1": (32, 48), "scale": (32,)}       # two layers' kernels and a norm scale
ROUNDING = 1e-6          # of each leaf's largest gradient: a few ulps of the terms a gradient sums
Run = tuple[dict[str, jax.Array], object]                               # parameters and optimiser state


def gradients(seed: int, error: float = 0.0) -> dict[str, jax.Array]:
    """Gradients with a tenth of their entries (the same in every step) cancelled to ~1e-9, as sums of terms of both
    signs can, and an error of up to `error` of each leaf's largest entry, as another summation order makes."""
    rng, cancelled = np.random.default_rng(seed), np.random.default_rng(99)
    grads = {}
    for name, shape in SHAPES.items():
        g = rng.normal(0, 0.01, shape)
        g[cancelled.uniform(size=shape) < 0.1] = 1e-9 * rng.normal()
        grads[name] = jnp.asarray(g + error * np.abs(g).max() * rng.uniform(-1, 1, shape), jnp.float32)
    return grads


def step(run: Run, grads: dict[str, jax.Array], optimizer=None) -> Run:
    """One AdamW step (default: OPT's) on `grads`."""
    params, opt_state = run
    params, opt_state, applied = apply_step(optimizer or make_optimizer(OPT, total_steps=10), grads, opt_state,
                                            params, optax.tree.norm(grads), jnp.float32(1.0))
    assert bool(applied)
    return params, opt_state


def start() -> Run:
    """The run two steps share: one step taken from random kernels and unit norm scales."""
    rng = np.random.default_rng(7)
    params = {name: jnp.asarray(rng.normal(0, 0.05, shape) if len(shape) > 1 else np.ones(shape), jnp.float32)
              for name, shape in SHAPES.items()}
    return step((params, make_optimizer(OPT, total_steps=10).init(params)), gradients(0))


def state(run: Run) -> AdamState:
    return adam_state(types.SimpleNamespace(params=run[0], opt_state=run[1]))


def assert_same_steps(ours: Run, theirs: Run, before: Run) -> None:
    assert_same_adam_step(state(ours), state(theirs), state(before), OPT, OPT.learning_rate)


def test_gradients_that_differ_by_rounding_pass_where_one_tolerance_fails():
    before = start()
    ours, theirs = step(before, gradients(1, error=ROUNDING)), step(before, gradients(1))
    apart = max(float(jnp.abs(ours[0][k] - theirs[0][k]).max()) for k in SHAPES)
    assert apart > 1e-3                   # 1e-4 at learning rate 1e-2 was the scanned-layers test's tolerance
    assert_same_steps(ours, theirs, before)


def test_a_gradient_in_the_wrong_layer_is_refused():
    before, grads = start(), gradients(1)
    swapped = {**grads, "layer0": grads["layer1"], "layer1": grads["layer0"]}
    with pytest.raises(AssertionError, match="gradient of"):
        assert_same_steps(step(before, swapped), step(before, grads), before)


def test_weight_decay_on_a_norm_scale_is_refused():
    before, grads = start(), gradients(1)
    everywhere = make_optimizer(OPT, total_steps=10, decay_mask=lambda params: jax.tree.map(lambda _: True, params))
    with pytest.raises(AssertionError, match="scale"):
        assert_same_steps(step(before, grads, everywhere), step(before, grads), before)


def test_a_gradient_error_beyond_rounding_is_refused():
    before = start()
    with pytest.raises(AssertionError, match="gradient of"):
        assert_same_steps(step(before, gradients(1, error=1e-3)), step(before, gradients(1)), before)
