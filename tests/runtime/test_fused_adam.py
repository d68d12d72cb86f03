"""`FusedAdam`: optax's clip + Adam(W) chain in two elementwise passes per parameter (issue 20).

Same numbers as optax's chain (to rounding: reciprocal multiplies), the same state pytree (checkpoints and
shardings unchanged), a step with a non-finite loss or gradient applies nothing, and the compiled step moves
about the bytes one AdamW pass needs, where optax's chain under XLA:CPU moves ~3.9x that.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxcore.bench import roofline
from jaxcore.runtime.fused_adam import FusedAdam
from jaxcore.runtime.optim import OptimizerConfig, apply_step, make_optimizer

SHAPES = {"embed": (512, 64), "kernel": (64, 192), "out": (192, 64), "scale": (64,)}


def tree(seed: int, scale: float = 1.0) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(seed), len(SHAPES))
    return {name: scale * jax.random.normal(k, shape) for k, (name, shape) in zip(keys, SHAPES.items(), strict=True)}


def run(optimizer, steps: int = 4, loss: float = 1.0, fused: bool = True):
    params, state = tree(0), optimizer.init(tree(0))
    transform = optimizer if fused else optimizer.reference
    for step in range(steps):
        grads = tree(100 + step, 0.5 if step % 2 else 3.0)        # above and below the clipping norm in turn
        params, state, applied = apply_step(transform, grads, state, params, optax.tree.norm(grads),
                                            jnp.float32(loss))
    return params, state, applied


@pytest.mark.parametrize("name, weight_decay, clip, schedule", [("adamw", 0.1, 1.0, "linear"),
                                                                ("adam", 0.0, None, "constant"),
                                                                ("adamw", 0.0, 2.0, "cosine")])
def test_it_computes_what_optax_computes(name, weight_decay, clip, schedule):
    cfg = OptimizerConfig(name, learning_rate=1e-2, weight_decay=weight_decay, max_grad_norm=clip, schedule=schedule,
                          warmup_steps=1)
    optimizer = make_optimizer(cfg, total_steps=6)
    assert isinstance(optimizer, FusedAdam)
    (fused, fused_state, applied), (plain, plain_state, _) = run(optimizer), run(optimizer, fused=False)
    assert bool(applied)
    assert jax.tree.structure(fused_state) == jax.tree.structure(plain_state)
    for a, b in zip(jax.tree.leaves((fused, fused_state)), jax.tree.leaves((plain, plain_state)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-7)
    assert not np.allclose(np.asarray(fused["kernel"]), np.asarray(tree(0)["kernel"]))     # it did move


@pytest.mark.parametrize("loss, grad_scale", [(float("nan"), 1.0), (1.0, float("inf")), (float("inf"), 1.0)])
def test_a_step_with_a_non_finite_loss_or_gradient_applies_nothing(loss, grad_scale):
    optimizer = make_optimizer(OptimizerConfig("adamw", learning_rate=1e-2, weight_decay=0.1, max_grad_norm=1.0), 5)
    params, state, _ = run(optimizer, steps=2)
    grads = tree(7, grad_scale)
    new_params, new_state, applied = apply_step(optimizer, grads, state, params, optax.tree.norm(grads),
                                                jnp.float32(loss))
    assert not bool(applied)
    for a, b in zip(jax.tree.leaves((new_params, new_state)), jax.tree.leaves((params, state)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_compiled_step_moves_one_adamw_pass_of_bytes():
    """XLA's count of the bytes the compiled step accesses, against `roofline.adam_step` (read weight, grad, m, v;
    write weight, m, v): 1.57x (the gradient norm and clipping read the gradients once more). optax's chain with
    the finiteness checks and the cond the step used before: 3.86x (three fusions each recomputing the moments,
    both moments copied, and two passes of checks)."""
    optimizer = make_optimizer(OptimizerConfig("adamw", learning_rate=1e-4, weight_decay=0.01, max_grad_norm=1.0), 10)
    params, grads = tree(0), tree(1)
    need = roofline.adam_step(sum(int(np.prod(s)) for s in SHAPES.values()))["bytes"]

    def accessed(transform) -> float:
        step = jax.jit(lambda p, s, g: apply_step(transform, g, s, p, optax.tree.norm(g), jnp.float32(1.0)),
                       donate_argnums=(0, 1))
        cost = step.lower(params, optimizer.init(params), grads).compile().cost_analysis()
        return float((cost[0] if isinstance(cost, list) else cost)["bytes accessed"]) / need

    fused, plain = accessed(optimizer), accessed(optimizer.reference)
    assert fused < 1.7 < 3 < plain, (fused, plain)
