"""The GRPO optimisation step: jit'd forward/backward/AdamW over fp32 master parameters.

Batch layout (TRL's, concatenated): `input_ids_BT` is the left-padded prompt followed by the
right-padded completion, `attention_mask_BT` marks real tokens, and every per-token array has
L = T - 1 positions aligned with `jaxcore.inference.logprobs.completion_logprobs`: position t scores token
t + 1. `completion_mask_BL` is 1 where token t + 1 is a completion token to train on.

    learner = GRPOLearner(jaxcore.load_hf(path), cfg, mesh=grpo_mesh())        # cfg: a GRPOConfig
    batch = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, eos_ids)
    metrics = learner.train_on_rollout(batch)     # num_iterations passes over one rollout

Gradient accumulation splits the batch into `gradient_accumulation_steps` strided micro-batches
(micro-batch k holds rows k, k + n, k + 2n, ...; this keeps every micro-batch evenly spread over
the data-sharded devices) and runs them in one `lax.scan`. As in TRL, grpo/bnpo/dr_grpo/sapo/luspo
average the micro-batch losses (and every type averages the entropy bonus), while dapo/cispo/vespo
divide every micro-batch's token sum by the token count of the whole step. Normalisers are global
over devices, so a sharded step equals the one-device step.
The learner (optimiser, reference model, steps per generation, LoRA) is `jaxcore.grpo.learner`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcore.grpo.async_loss import async_grpo_loss
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.loss import adapted_entropy_coef, entropy_bonus_enabled, grpo_loss, masked_mean
from jaxcore.grpo.packing import PackedTrees, tree_logps
from jaxcore.inference.logprobs import token_logprobs_and_entropy
from jaxcore.model.transformer import Transformer
from jaxcore.runtime.fused_adam import FusedAdam
from jaxcore.runtime.optim import apply_step, make_schedule

Array = jax.Array
Params = dict[str, Any]                    # nnx.to_pure_dict of the model's nnx.Param state


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GRPOBatch:
    """One rollout's completions, ready for the loss (see the module docstring for the layout)."""

    input_ids_BT: Array
    attention_mask_BT: Array
    completion_mask_BL: Array
    advantages_B: Array
    truncated_B: Array                      # bool: the completion hit the length limit (no EOS)
    old_logp_BL: Array | None = None        # policy log-probs at rollout time (needed when mu > 1)
    ref_logp_BL: Array | None = None        # reference log-probs (needed when beta != 0)
    # the same tokens as prefix trees in packed rows (`jaxcore.grpo.packing`): what the forwards run when set
    trees: PackedTrees | None = None
    # the first position that can score a completion token (prompt width - 1): the LM head, log-softmax and
    # entropy run only from here on, and the per-token arrays are read from here on (static: part of the shape)
    completion_start: int = dataclasses.field(default=0, metadata=dict(static=True))

    def replace(self, **changes: Any) -> GRPOBatch:
        return dataclasses.replace(self, **changes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: Array
    params: Params
    opt_state: Any
    # with grpo.use_adaptive_entropy: [the entropy coefficient, the last optimiser step's token entropy (inf
    # before the first: no bonus then)], TRL's controller state; None otherwise
    entropy_control: Array | None = None


def build_batch(prompt_ids_BP: Any, prompt_mask_BP: Any, completion_ids_BC: Any, completion_mask_BC: Any,
                advantages_B: Any, eos_token_ids: Sequence[int] = (), tool_mask_BC: Any = None, *,
                pad_token_id: int | None = None) -> GRPOBatch:
    """Concatenate TRL-style prompt/completion arrays into a host-side `GRPOBatch`.

    A completion is truncated when its last real token is neither one of `eos_token_ids` nor `pad_token_id`
    (TRL's `eos_and_pad`; no EOS given: nothing counts as truncated). `completion_mask_BC` is 1 up to and
    including the EOS. `tool_mask_BC`
    (TRL's, from a multi-turn rollout) is 0 on the completion tokens the model did not generate (tool
    results): they stay attended to but leave the loss, as TRL's `completion_mask * tool_mask`.
    """
    prompt_mask_BP = np.asarray(prompt_mask_BP, np.int32)
    completion_ids_BC = np.asarray(completion_ids_BC, np.int32)
    completion_mask_BC = np.asarray(completion_mask_BC, np.int32)
    b, p = prompt_mask_BP.shape
    length_B = completion_mask_BC.sum(1)
    last_B = completion_ids_BC[np.arange(b), np.maximum(length_B - 1, 0)]
    ends = [*eos_token_ids, *([] if pad_token_id is None else [pad_token_id])]
    truncated_B = (length_B > 0) & ~np.isin(last_B, ends) if len(eos_token_ids) else np.zeros(b, bool)
    trained_BC = completion_mask_BC if tool_mask_BC is None else completion_mask_BC * np.asarray(tool_mask_BC, np.int32)
    return GRPOBatch(
        input_ids_BT=np.concatenate([np.asarray(prompt_ids_BP, np.int32), completion_ids_BC], 1),
        attention_mask_BT=np.concatenate([prompt_mask_BP, completion_mask_BC], 1),
        completion_mask_BL=np.concatenate([np.zeros((b, p - 1), np.int32), trained_BC], 1),
        advantages_B=np.asarray(advantages_B, np.float32),
        truncated_B=truncated_B, completion_start=p - 1)


def rollout_metrics(batch: GRPOBatch) -> dict[str, float]:
    """TRL's completion logs for one rollout, plus `rollout_tokens` (TRL's `num_tokens` is their running sum): the
    prompt tokens and the completion tokens the model generated (a multi-turn episode's tool results left out, as
    TRL counts `sum(tool_mask)`)."""
    length_B = np.asarray(batch.completion_mask_BL).sum(1)
    truncated_B = np.asarray(batch.truncated_B, bool)
    done_B = length_B[~truncated_B] if (~truncated_B).any() else np.zeros(1)
    return {"completions/mean_length": float(length_B.mean()), "completions/min_length": float(length_B.min()),
            "completions/max_length": float(length_B.max()), "completions/clipped_ratio": float(truncated_B.mean()),
            "completions/mean_terminated_length": float(done_B.mean()),
            "completions/min_terminated_length": float(done_B.min()),
            "completions/max_terminated_length": float(done_B.max()),
            "rollout_tokens": float(np.asarray(batch.attention_mask_BT)[:, :batch.completion_start + 1].sum()
                                    + length_B.sum())}


# ----------------------------------------------------------------------------- loss of one batch


def policy_logps(model: Transformer, input_ids_BT: Array, attention_mask_BT: Array, temperature: float = 1.0,
                 entropy_grad: bool = False, start: int = 0) -> tuple[Array, Array]:
    """Log-prob of every next token and the entropy there (differentiated only with `entropy_grad`), at the
    positions from `start` on: two [B, T-1-start] arrays (position t scores token t + 1).

    The last token scores nothing and attention is causal, so the forward runs on the first T - 1 tokens (the
    same numbers at every position it keeps), and the hidden states before `start` (the prompt's) never reach
    the LM head: the head, log-softmax and entropy run at exactly the T-1-start scoring positions.
    """
    logits_BLV = model(input_ids_BT[:, :-1], attention_mask=attention_mask_BT[:, :-1], logits_from=start)
    if temperature != 1.0:
        logits_BLV = logits_BLV / temperature
    return token_logprobs_and_entropy(logits_BLV, input_ids_BT[:, start + 1:], entropy_grad=entropy_grad)


def completion_logps(model: Transformer, batch: GRPOBatch, temperature: float = 1.0, entropy_grad: bool = False
                     ) -> tuple[Array, Array]:
    """`policy_logps` from the batch's `completion_start` on: over its packed trees where it has them (each prompt
    once), else over its rows."""
    s = batch.completion_start
    if batch.trees is None:
        return policy_logps(model, batch.input_ids_BT, batch.attention_mask_BT, temperature, entropy_grad, start=s)
    return tree_logps(model, batch.trees, batch.input_ids_BT[:, s + 1:], temperature, entropy_grad)


def loss_mask(batch: GRPOBatch, mask_truncated_completions: bool) -> Array:
    """The completion mask, with truncated completions removed when asked (TRL's option)."""
    mask_BL = batch.completion_mask_BL.astype(bool)
    if mask_truncated_completions:
        mask_BL = mask_BL & ~batch.truncated_B.astype(bool)[:, None]
    return mask_BL


def batch_objective(model: Transformer, batch: GRPOBatch, cfg: GRPOConfig,
                    num_items_in_batch: Array | None = None, accumulation_steps: int = 1,
                    entropy_coef: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """GRPO loss of one (micro-)batch under `model`, with TRL's metrics plus `entropy`: the loss settings
    are `cfg.grpo`, the log-probs at the rollout's temperature, and dr_grpo's normaliser its
    `completion_tokens` (TRL's max_completion_length: a multi-turn episode's max_episode_tokens).
    The prompt positions are masked out of every term, so dropping them (`completion_start`) changes no number."""
    g, s = cfg.grpo, batch.completion_start         # only positions from s on can score completion tokens
    mask_BL = loss_mask(batch, g.mask_truncated_completions)[:, s:]
    logp_BL, entropy_BL = completion_logps(model, batch, cfg.rollout.temperature, entropy_bonus_enabled(g))
    old_logp_BL = None if batch.old_logp_BL is None else batch.old_logp_BL[:, s:]
    if g.asynchronous is not None:      # TRL's AsyncGRPO loss: old_logp_BL holds the sampler's log-probs, if any
        loss, metrics = async_grpo_loss(logp_BL, old_logp_BL, batch.advantages_B, mask_BL, epsilon=g.epsilon,
                                        epsilon_high=g.epsilon_high, num_tokens=mask_BL.sum(),
                                        accumulation_steps=accumulation_steps)
        metrics["entropy"] = masked_mean(jax.lax.stop_gradient(entropy_BL), mask_BL)
        return loss, metrics
    ref_logp_BL = batch.ref_logp_BL[:, s:] if g.beta != 0.0 else None
    loss, metrics = grpo_loss(logp_BL, old_logp_BL, ref_logp_BL, batch.advantages_B, mask_BL, g,
                              num_items_in_batch, entropy_BT=entropy_BL, accumulation_steps=accumulation_steps,
                              max_completion_length=cfg.rollout.completion_tokens, entropy_coef=entropy_coef)
    metrics["entropy"] = masked_mean(jax.lax.stop_gradient(entropy_BL), mask_BL)
    return loss, metrics


def loss_and_grads(model: Transformer, batch: GRPOBatch, cfg: GRPOConfig
                   ) -> tuple[Array, dict[str, Array], Params]:
    """Loss, metrics and d loss / d params (a pure dict shaped like the params) of one whole batch
    (compiled per call: the config is closed over, not a static argument)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def value_and_grad(params: Params, rest: nnx.State, batch: GRPOBatch
                       ) -> tuple[tuple[Array, dict[str, Array]], Params]:
        def objective(params: Params) -> tuple[Array, dict[str, Array]]:
            return batch_objective(nnx.merge(graphdef, params, rest), batch, cfg)

        return jax.value_and_grad(objective, has_aux=True)(params)

    (loss, metrics), grads = value_and_grad(nnx.to_pure_dict(params), rest, jax.tree.map(jnp.asarray, batch))
    return loss, metrics, grads


# ----------------------------------------------------------------------------- the train step


def _micro_batches(batch: GRPOBatch, n: int, sharding: jax.sharding.Sharding | None) -> GRPOBatch:
    """[B, ...] -> [n, B / n, ...] with micro-batch k = rows k, k + n, ... (stays evenly sharded)."""
    def split(x: Array) -> Array:
        x = jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)
    return jax.tree.map(split, batch)


Builder = Callable[[Params, Any, Array | None], Transformer]   # (trainable, frozen, dropout key) -> model


def make_train_step(build: Builder, cfg: GRPOConfig, optimizer: optax.GradientTransformation | FusedAdam,
                    micro_batch_sharding: jax.sharding.Sharding | None = None
                    ) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """The un-jitted step(state, frozen, batch, num_items, key): accumulate gradients over micro-batches,
    clip, AdamW-update (skipped if non-finite). `num_items` is the dapo/cispo/vespo normaliser of the step
    (TRL: the rollout's active tokens / optimiser steps per rollout); `key` feeds LoRA dropout."""
    n = cfg.grpo.gradient_accumulation_steps
    schedule = make_schedule(cfg.optimizer, cfg.total_steps)     # the learning rate `optimizer` follows, logged

    adaptive = cfg.grpo.use_adaptive_entropy

    def micro_loss(params: Params, frozen: Any, micro: GRPOBatch, num_items: Array, key: Array | None,
                   entropy_coef: Array | None) -> tuple[Array, dict[str, Array]]:
        return batch_objective(build(params, frozen, key), micro, cfg, num_items, n, entropy_coef)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def step(state: TrainState, frozen: Any, batch: GRPOBatch, num_items: Array, key: Array | None
             ) -> tuple[TrainState, dict[str, Array]]:
        control = state.entropy_control
        # TRL's controller: this step's bonus coefficient, from the last step's entropy (inf at first: none)
        coef = jnp.where(control[1] <= cfg.grpo.entropy_target, control[0], 0.0) if adaptive else None

        def accumulate(grads: Params, micro_k: tuple[GRPOBatch, Array]
                       ) -> tuple[Params, tuple[Array, dict[str, Array]]]:
            micro, k = micro_k
            micro_key = None if key is None else jax.random.fold_in(key, k)
            (loss, metrics), g = grad_fn(state.params, frozen, micro, num_items, micro_key, coef)
            return jax.tree.map(jnp.add, grads, g), (loss, metrics)

        if n == 1:     # no accumulation buffer, no loop
            (loss, metrics), grads = grad_fn(state.params, frozen, batch, num_items, key, coef)
            losses, metrics = loss[None], jax.tree.map(lambda x: x[None], metrics)
        else:
            zeros = jax.tree.map(jnp.zeros_like, state.params)
            micros = (_micro_batches(batch, n, micro_batch_sharding), jnp.arange(n))
            grads, (losses, metrics) = jax.lax.scan(accumulate, zeros, micros)
        if adaptive:    # the window's token-weighted entropy moves the coefficient for the next step
            window_entropy = metrics.pop("entropy_sum").sum() / jnp.maximum(metrics.pop("entropy_tokens").sum(), 1.0)
            control = jnp.stack([adapted_entropy_coef(control[0], window_entropy, cfg.grpo), window_entropy])
        metrics = {k: v.mean() for k, v in metrics.items()}   # TRL averages per-micro-batch metrics
        metrics.update(loss=losses.sum(), grad_norm=optax.tree.norm(grads),
                       learning_rate=schedule(state.step), loss_tokens=num_items)
        # A non-finite loss, gradient, update or new parameter (e.g. a NaN learning rate) applies nothing (params,
        # moments and step stay as they were); `skipped` says so.
        params, opt_state, applied = apply_step(optimizer, grads, state.opt_state, state.params,
                                                metrics["grad_norm"], metrics["loss"])
        metrics["skipped"] = (~applied).astype(jnp.float32)
        if adaptive:                  # a skipped step leaves the controller too as it was
            control = jnp.where(applied, control, state.entropy_control)
            metrics["entropy_coef"] = control[0]
        elif entropy_bonus_enabled(cfg.grpo):
            metrics["entropy_coef"] = jnp.float32(cfg.grpo.entropy_coef)       # TRL logs it whenever it applies
        return TrainState(state.step + applied.astype(state.step.dtype), params, opt_state, control), metrics

    return step
