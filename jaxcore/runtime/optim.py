"""The optimiser settings (the `optimizer:` section), HF's learning-rate schedules, and the one optimiser
factory that ES and GRPO both use."""

from __future__ import annotations

import dataclasses

import jax
import optax

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass
class OptimizerConfig:
    """The `optimizer:` section. ES defaults to SGD at a constant rate; the GRPO job config composes it with
    TRL's defaults (AdamW, 1e-6, linear decay to 0 over the run, gradients clipped at norm 1)."""

    name: str = "sgd"                   # sgd | adam | adamw
    learning_rate: float = 1e-3
    weight_decay: float = 0.0           # sgd: added to the gradient; adamw: decoupled, matrices only (as HF)
    momentum: float | None = None       # sgd only
    schedule: str = "constant"          # constant | cosine | linear (TRL's lr_scheduler_type)
    warmup_steps: int = 0               # linear warmup from 0
    max_grad_norm: float | None = None  # global-norm clipping (None or <= 0: none)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8


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


def _matrices(params: object) -> object:
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(cfg: OptimizerConfig, total_steps: int = 1,
                   learning_rate: float | optax.Schedule | None = None) -> optax.GradientTransformation:
    """Global-norm clipping (when `max_grad_norm` > 0), then SGD, Adam or AdamW at `make_schedule(cfg,
    total_steps)` (or `learning_rate`, a number or an optax schedule, when given)."""
    lr = make_schedule(cfg, total_steps) if learning_rate is None else learning_rate
    if cfg.name == "sgd":
        opt = optax.sgd(lr, momentum=cfg.momentum)
        if cfg.weight_decay:
            opt = optax.chain(optax.add_decayed_weights(cfg.weight_decay), opt)
    elif cfg.name == "adam":
        opt = optax.adam(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon)
    elif cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon,
                          weight_decay=cfg.weight_decay, mask=_matrices)
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r}; choose {', '.join(OPTIMIZERS)}")
    if cfg.max_grad_norm and cfg.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return opt
