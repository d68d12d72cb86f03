"""Adam / AdamW with global-norm clipping in two elementwise passes per parameter, skipped as a whole on bad input.

optax's chain (clip_by_global_norm, scale_by_adam, add_decayed_weights, scale_by_learning_rate), compiled by
XLA:CPU, writes the parameter and the two moments in three fusions that each recompute the moments' divisions
and square root, and copies both moments so that the parameter's fusion can still read their old values: several
times what the memory traffic needs. `FusedAdam` writes the new moments first (multiply-adds only), then the
parameter from them with one division and one square root per entry and the bias corrections as reciprocals. Its
state is optax's (the same pytree), so
checkpoints and shardings are unchanged, and `init` / `update` are optax's for any caller that wants them; the
results agree with optax's to rounding (a reciprocal multiply where optax divides).

`apply(...)` applies nothing (parameters, moments and counts stay) unless the loss, the gradient norm and the
learning rate are finite: with eps > 0 and finite moments, those make every update finite, so no pass over the
updates is needed to find out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def decays(param: Array) -> bool:
    """Whether AdamW's decoupled weight decay applies to `param`: matrices only (HF's AdamW skips biases and
    norm scales), in `FusedAdam` and in optax's mask alike."""
    return param.ndim >= 2


def matrices(params: Any) -> Any:
    """The default decay mask: `decays` of every leaf (a tree of bools like `params`)."""
    return jax.tree.map(decays, params)


@dataclasses.dataclass(frozen=True)
class FusedAdam:
    """optax's `chain(clip_by_global_norm(max_grad_norm), adamw(...))` (or `adam`: weight_decay 0) as one step."""

    reference: optax.GradientTransformation    # optax's chain: the state layout, and `update` for other callers
    learning_rate: float | optax.Schedule
    b1: float
    b2: float
    eps: float
    weight_decay: float = 0.0                   # decoupled, where `decay_mask` says (matrices), as HF's AdamW
    max_grad_norm: float | None = None          # None: no clipping
    decay_mask: Callable[[Any], Any] = matrices   # params -> bools: which leaves weight decay applies to

    @property
    def init(self) -> Any:
        return self.reference.init

    @property
    def update(self) -> Any:
        return self.reference.update

    def apply(self, grads: Any, state: Any, params: Any, grad_norm: Array, loss: Array) -> tuple[Any, Any, Array]:
        """(new params, new state, applied): one Adam(W) step on `grads` (whose global norm is `grad_norm`), or
        nothing where `loss`, `grad_norm` or the learning rate is not finite."""
        adam = _find_adam(state)
        lr = jnp.asarray(self.learning_rate(adam.count) if callable(self.learning_rate) else self.learning_rate,
                         jnp.float32)
        applied = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(lr)
        scale = jnp.float32(1.0)
        if self.max_grad_norm is not None:   # optax: g / norm * max_norm once norm >= max_norm
            scale = jnp.where(grad_norm < self.max_grad_norm, 1.0, self.max_grad_norm / grad_norm)
        count = optax.safe_increment(adam.count)
        inv_correction1 = 1.0 / (1.0 - self.b1 ** count.astype(jnp.float32))
        inv_correction2 = 1.0 / (1.0 - self.b2 ** count.astype(jnp.float32))

        def first_moment(g: Array, m: Array) -> Array:
            g = g * scale.astype(g.dtype)
            return jnp.where(applied, (1.0 - self.b1) * g + self.b1 * m, m)

        def second_moment(g: Array, v: Array) -> Array:
            g = g * scale.astype(g.dtype)
            return jnp.where(applied, (1.0 - self.b2) * (g * g) + self.b2 * v, v)

        mu, nu = jax.tree.map(first_moment, grads, adam.mu), jax.tree.map(second_moment, grads, adam.nu)
        mu, nu = jax.lax.optimization_barrier((mu, nu))   # the parameter pass reads them, it does not recompute them

        def parameter(p: Array, m: Array, v: Array, decay: bool) -> Array:
            u = (m * inv_correction1.astype(m.dtype)) / (jnp.sqrt(v * inv_correction2.astype(v.dtype)) + self.eps)
            if self.weight_decay and decay:
                u = u + self.weight_decay * p
            return jnp.where(applied, (p - lr.astype(p.dtype) * u).astype(p.dtype), p)

        new_params = jax.tree.map(parameter, params, mu, nu, self.decay_mask(params))
        new_adam = adam._replace(count=jnp.where(applied, count, adam.count), mu=mu, nu=nu)
        return new_params, _rebuild(state, new_adam, applied), applied


def _find_adam(state: Any) -> optax.ScaleByAdamState | None:
    if isinstance(state, optax.ScaleByAdamState):
        return state
    if type(state) is tuple:
        for part in state:
            found = _find_adam(part)
            if found is not None:
                return found
    return None


def _rebuild(state: Any, adam: optax.ScaleByAdamState, applied: Array) -> Any:
    """`state` with its Adam state replaced and its schedule count advanced (where applied), as optax's update."""
    if isinstance(state, optax.ScaleByAdamState):
        return adam
    if isinstance(state, optax.ScaleByScheduleState):
        return state._replace(count=jnp.where(applied, optax.safe_increment(state.count), state.count))
    if type(state) is tuple:
        return tuple(_rebuild(part, adam, applied) for part in state)
    return state
