"""Learning-rate schedules and optimizers built from an `OptimizerSection`."""

from __future__ import annotations

import optax

from jaxcore.train_config import OptimizerSection


def make_schedule(section: OptimizerSection, total_steps: int) -> optax.Schedule:
    """constant, cosine or linear decay after `warmup_steps` of linear warmup."""
    lr, warmup = section.learning_rate, max(section.warmup_steps, 0)
    decay_steps = max(total_steps - warmup, 1)
    if section.schedule == "constant":
        body = optax.constant_schedule(lr)
    elif section.schedule == "cosine":
        body = optax.cosine_decay_schedule(lr, decay_steps)
    elif section.schedule == "linear":
        body = optax.linear_schedule(lr, 0.0, decay_steps)
    else:
        raise ValueError(f"unknown schedule {section.schedule!r}; choose constant, cosine or linear")
    if warmup == 0:
        return body
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), body], [warmup])
