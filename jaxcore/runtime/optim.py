"""The optimiser settings (the `optimizer:` section), HF's learning-rate schedules, and the one optimiser
factory that ES and GRPO both use."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import jax
import optax
from annotated_types import Ge, Gt, Interval

from jaxcore.config.schema import Checked
from jaxcore.runtime.fused_adam import FusedAdam, matrices

OptimizerName = Literal["sgd", "adam", "adamw"]
Schedule = Literal["constant", "cosine", "linear"]
OPTIMIZERS = typing.get_args(OptimizerName)
SCHEDULES = typing.get_args(Schedule)


@dataclasses.dataclass
class OptimizerConfig(Checked):
    """The `optimizer:` section. ES defaults to SGD at a constant rate; the GRPO job config composes it with
    TRL's defaults (AdamW, 1e-6, linear decay to 0 over the run, gradients clipped at norm 1)."""

    name: OptimizerName = "sgd"
    learning_rate: Annotated[float, Ge(0)] = 1e-3
    weight_decay: Annotated[float, Ge(0)] = 0.0   # sgd: added to the gradient; adamw: decoupled, matrices only (HF)
    momentum: Annotated[float, Interval(ge=0, lt=1)] | None = None   # sgd only
    schedule: Schedule = "constant"     # TRL's lr_scheduler_type
    warmup_steps: Annotated[int, Ge(0)] = 0   # linear warmup from 0
    max_grad_norm: float | None = None  # global-norm clipping (None or <= 0: none)
    adam_beta1: Annotated[float, Interval(ge=0, lt=1)] = 0.9
    adam_beta2: Annotated[float, Interval(ge=0, lt=1)] = 0.999
    adam_epsilon: Annotated[float, Gt(0)] = 1e-8


def make_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """HF's get_{constant,linear,cosine}_schedule_with_warmup: 0 -> lr over `warmup_steps`, then constant,
    or linear/cosine decay to 0 at `total_steps`."""
    lr, warmup = cfg.learning_rate, max(cfg.warmup_steps, 0)
    decay_steps = max(total_steps - warmup, 1)
    if cfg.schedule == "constant":
        body = optax.constant_schedule(lr)
    elif cfg.schedule == "cosine":
        body = optax.cosine_decay_schedule(lr, decay_steps)
    elif cfg.schedule == "linear":
        body = optax.linear_schedule(lr, 0.0, decay_steps)
    else:
        raise ValueError(f"unknown schedule {cfg.schedule!r}; choose {', '.join(SCHEDULES)}")
    if warmup == 0:
        return body
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), body], [warmup])


def check_learning_rate(cfg: OptimizerConfig, total_steps: int,
                        learning_rate: float | optax.Schedule | None = None) -> None:
    """Refuse (one-line `ConfigValueError`) a learning rate that is not a finite number >= 0 at every step
    0..total_steps of its schedule (`make_schedule(cfg, total_steps)`, or `learning_rate` when given), and
    optimiser settings that are not finite: such a rate turns every weight into NaN. A momentum for another
    optimizer than sgd is refused too (it would be ignored)."""
    import numpy as np

    from jaxcore.errors import ConfigValueError

    for key in ("learning_rate", "weight_decay", "momentum", "max_grad_norm", "adam_beta1", "adam_beta2",
                "adam_epsilon"):
        value = getattr(cfg, key)
        if value is not None and not np.isfinite(float(value)):
            raise ConfigValueError(f"optimizer.{key}: {value} is not a finite number")
    if cfg.momentum is not None and cfg.name != "sgd":
        raise ConfigValueError(f"optimizer.momentum={cfg.momentum}: only sgd takes a momentum ({cfg.name}'s are "
                               "adam_beta1 and adam_beta2)")
    lr = make_schedule(cfg, total_steps) if learning_rate is None else learning_rate
    rates = np.asarray(lr(np.arange(max(total_steps, 1) + 1)) if callable(lr) else lr, np.float64)
    bad = ~np.isfinite(rates) | (rates < 0)
    if bad.any():
        step = int(np.argmax(bad.reshape(-1)))
        raise ConfigValueError(f"optimizer.learning_rate: the schedule gives {float(rates.reshape(-1)[step])} at "
                               f"step {step}; it must be a finite number >= 0 at every step")


def all_finite(tree: object) -> jax.Array:
    """One boolean scalar: every entry of every array in `tree` is finite (cheap, on device; for jitted steps)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jax.numpy.asarray(True)
    return jax.numpy.stack([jax.numpy.isfinite(x).all() for x in leaves]).all()


def make_optimizer(cfg: OptimizerConfig, total_steps: int = 1,
                   learning_rate: float | optax.Schedule | None = None,
                   decay_mask: Callable[[Any], Any] = matrices) -> optax.GradientTransformation | FusedAdam:
    """Global-norm clipping (when `max_grad_norm` > 0), then SGD, Adam or AdamW at `make_schedule(cfg,
    total_steps)` (or `learning_rate`, a number or an optax schedule, when given). Adam and AdamW come as
    `FusedAdam` (optax's chain, with a fused step for `apply_step`). AdamW's weight decay applies where
    `decay_mask(params)` is True (default: the matrices; a stacked layer axis is not a matrix dimension)."""
    check_learning_rate(cfg, total_steps, learning_rate)
    lr = make_schedule(cfg, total_steps) if learning_rate is None else learning_rate
    if cfg.name == "sgd":
        opt = optax.sgd(lr, momentum=cfg.momentum)
        if cfg.weight_decay:
            opt = optax.chain(optax.add_decayed_weights(cfg.weight_decay), opt)
    elif cfg.name == "adam":
        opt = optax.adam(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon)
    elif cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon,
                          weight_decay=cfg.weight_decay, mask=decay_mask)
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r}; choose {', '.join(OPTIMIZERS)}")
    clip = cfg.max_grad_norm if cfg.max_grad_norm and cfg.max_grad_norm > 0 else None
    if clip is not None:
        opt = optax.chain(optax.clip_by_global_norm(clip), opt)
    if cfg.name == "sgd":
        return opt
    return FusedAdam(opt, lr, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon,
                     cfg.weight_decay if cfg.name == "adamw" else 0.0, clip, decay_mask)


def apply_step(optimizer: optax.GradientTransformation | FusedAdam, grads: object, opt_state: object,
               params: object, grad_norm: jax.Array, loss: jax.Array) -> tuple[object, object, jax.Array]:
    """(params, optimiser state, applied) after one step on `grads`, or the inputs unchanged (applied False) where
    the loss, gradient norm, update or new parameters are not finite. `FusedAdam` checks the scalars that make
    its update finite and selects within its own passes; any other optax transformation is checked on its update
    and new parameters, and a cond keeps the old state."""
    if isinstance(optimizer, FusedAdam):
        return optimizer.apply(grads, opt_state, params, grad_norm, loss)
    updates, new_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    applied = (jax.numpy.isfinite(loss) & jax.numpy.isfinite(grad_norm) & all_finite(updates)
               & all_finite(new_params))
    # A cond, not a select per array: XLA would copy the chain of one `and` per array that makes `applied` into the
    # select of every state array (O(arrays^2) scalar ops, ~450k at 30 layers: minutes of compilation).
    params, opt_state = jax.lax.cond(applied, lambda: (new_params, new_state), lambda: (params, opt_state))
    return params, opt_state, applied
