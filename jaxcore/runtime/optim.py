"""Learning-rate schedules and optimizers built from an `OptimizerSection`."""

from __future__ import annotations

import optax

from jaxcore.config.jobs import OptimizerSection


def make_schedule(section: OptimizerSection, total_steps: int) -> optax.Schedule:
    """constant, cosine or linear decay after `warmup_steps` of linear warmup."""
    return lr_schedule(section.schedule, section.learning_rate, section.warmup_steps, total_steps)


def lr_schedule(name: str, lr: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
    """HF's get_{constant,linear,cosine}_schedule_with_warmup: 0 -> lr over `warmup_steps`, then
    constant, or linear/cosine decay to 0 at `total_steps`."""
    warmup = max(warmup_steps, 0)
    decay_steps = max(total_steps - warmup, 1)
    if name == "constant":
        body = optax.constant_schedule(lr)
    elif name == "cosine":
        body = optax.cosine_decay_schedule(lr, decay_steps)
    elif name == "linear":
        body = optax.linear_schedule(lr, 0.0, decay_steps)
    else:
        raise ValueError(f"unknown schedule {name!r}; choose constant, cosine or linear")
    if warmup == 0:
        return body
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), body], [warmup])
