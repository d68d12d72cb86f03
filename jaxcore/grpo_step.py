"""The GRPO optimisation step: jit'd forward/backward/AdamW over fp32 master parameters.

Batch layout (TRL's, concatenated): `input_ids_BT` is the left-padded prompt followed by the
right-padded completion, `attention_mask_BT` marks real tokens, and every per-token array has
L = T - 1 positions aligned with `jaxcore.logprobs.completion_logprobs`: position t scores token
t + 1. `completion_mask_BL` is 1 where token t + 1 is a completion token to train on.

    learner = GRPOLearner(jaxcore.load_hf(path), GRPOTrainConfig(beta=0.04), mesh=make_mesh())
    batch = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, eos_ids)
    metrics = learner.train_on_rollout(batch)     # num_iterations optimiser steps on one rollout

Gradient accumulation splits the batch into `gradient_accumulation_steps` strided micro-batches
(micro-batch k holds rows k, k + n, k + 2n, ...; this keeps every micro-batch evenly spread over
the data-sharded devices) and runs them in one `lax.scan`. As in TRL, grpo/bnpo/dr_grpo average the
micro-batch losses and dapo divides every micro-batch's token sum by the token count of the whole
batch. Normalisers are global over devices, so a sharded step equals the one-device step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcore.grpo import GRPOLossConfig, grpo_loss, masked_mean
from jaxcore.logprobs import token_entropy, token_logprobs
from jaxcore.model import Transformer
from jaxcore.sharding import fsdp_shardings, replicated

Array = jax.Array
Params = dict[str, Any]                    # nnx.to_pure_dict of the model's nnx.Param state
BATCH_AXES = ("data", "fsdp")              # mesh axes the batch is split over (those present)


@dataclasses.dataclass(frozen=True)
class GRPOTrainConfig(GRPOLossConfig):
    """Loss settings plus the optimiser and step settings (TRL/HF names and defaults)."""

    learning_rate: float = 1e-6
    lr_schedule: str = "constant"           # "constant" | "cosine" (to 0 at total_steps), after warmup
    warmup_steps: int = 0                   # linear warmup from 0
    total_steps: int = 1000                 # horizon of the cosine schedule
    weight_decay: float = 0.0               # decoupled (AdamW); matrices only, as HF skips biases/norms
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0              # global-norm clipping; <= 0 disables
    gradient_accumulation_steps: int = 1
    num_iterations: int = 1                 # mu: optimiser steps per rollout, reusing stored old_logp
    mask_truncated_completions: bool = False
    temperature: float = 1.0                # logits / temperature before log-softmax, as in TRL
    compute_dtype: str | None = None        # e.g. "bfloat16"; None keeps the model's (params stay fp32)
    remat: bool | None = None               # rematerialise each block in the backward; None keeps the model's

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; expected constant or cosine")
        if self.gradient_accumulation_steps < 1 or self.num_iterations < 1:
            raise ValueError("gradient_accumulation_steps and num_iterations must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")


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

    def replace(self, **changes: Any) -> GRPOBatch:
        return dataclasses.replace(self, **changes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: Array
    params: Params
    opt_state: Any


def build_batch(prompt_ids_BP: Any, prompt_mask_BP: Any, completion_ids_BC: Any, completion_mask_BC: Any,
                advantages_B: Any, eos_token_ids: Sequence[int] = ()) -> GRPOBatch:
    """Concatenate TRL-style prompt/completion arrays into a host-side `GRPOBatch`.

    A completion is truncated when its last real token is not one of `eos_token_ids` (no EOS given:
    nothing counts as truncated). `completion_mask_BC` is 1 up to and including the EOS.
    """
    prompt_mask_BP = np.asarray(prompt_mask_BP, np.int32)
    completion_ids_BC = np.asarray(completion_ids_BC, np.int32)
    completion_mask_BC = np.asarray(completion_mask_BC, np.int32)
    b, p = prompt_mask_BP.shape
    length_B = completion_mask_BC.sum(1)
    last_B = completion_ids_BC[np.arange(b), np.maximum(length_B - 1, 0)]
    truncated_B = (length_B > 0) & ~np.isin(last_B, list(eos_token_ids)) if len(eos_token_ids) else \
        np.zeros(b, bool)
    return GRPOBatch(
        input_ids_BT=np.concatenate([np.asarray(prompt_ids_BP, np.int32), completion_ids_BC], 1),
        attention_mask_BT=np.concatenate([prompt_mask_BP, completion_mask_BC], 1),
        completion_mask_BL=np.concatenate([np.zeros((b, p - 1), np.int32), completion_mask_BC], 1),
        advantages_B=np.asarray(advantages_B, np.float32),
        truncated_B=truncated_B)


def rollout_metrics(batch: GRPOBatch) -> dict[str, float]:
    """TRL's completion logs for one rollout, plus `rollout_tokens` (prompt + completion tokens; TRL's
    `num_tokens` is their running sum)."""
    length_B = np.asarray(batch.completion_mask_BL).sum(1)
    truncated_B = np.asarray(batch.truncated_B, bool)
    done_B = length_B[~truncated_B] if (~truncated_B).any() else np.zeros(1)
    return {"completions/mean_length": float(length_B.mean()), "completions/min_length": float(length_B.min()),
            "completions/max_length": float(length_B.max()), "completions/clipped_ratio": float(truncated_B.mean()),
            "completions/mean_terminated_length": float(done_B.mean()),
            "completions/min_terminated_length": float(done_B.min()),
            "completions/max_terminated_length": float(done_B.max()),
            "rollout_tokens": float(np.asarray(batch.attention_mask_BT).sum())}


# ----------------------------------------------------------------------------- optimiser


def make_schedule(cfg: GRPOTrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate`, then constant or cosine decay to 0 at `total_steps`."""
    if cfg.lr_schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps,
                                                  max(cfg.total_steps, cfg.warmup_steps + 1), 0.0)
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.learning_rate)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
                                 optax.constant_schedule(cfg.learning_rate)], [cfg.warmup_steps])


def make_optimizer(cfg: GRPOTrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW (weight decay on matrices only)."""
    adamw = optax.adamw(make_schedule(cfg), b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon,
                        weight_decay=cfg.weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    if cfg.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
    return adamw


# ----------------------------------------------------------------------------- loss of one batch


def policy_logps(model: Transformer, input_ids_BT: Array, attention_mask_BT: Array, temperature: float = 1.0
                 ) -> tuple[Array, Array]:
    """Log-prob of every next token and the (non-differentiated) entropy there: two [B, T-1] arrays.

    The [B, T, V] logits are never sliced (that would cost a copy forward and a pad backward): the
    last position scores a dummy target and is dropped from the small [B, T] results.
    """
    logits_BTV = model(input_ids_BT, attention_mask=attention_mask_BT)
    if temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    targets_BT = jnp.pad(input_ids_BT[:, 1:], ((0, 0), (0, 1)))
    logp_BT = token_logprobs(logits_BTV, targets_BT)
    entropy_BT = token_entropy(jax.lax.stop_gradient(logits_BTV))
    return logp_BT[:, :-1], entropy_BT[:, :-1]


def loss_mask(batch: GRPOBatch, mask_truncated_completions: bool) -> Array:
    """The completion mask, with truncated completions removed when asked (TRL's option)."""
    mask_BL = batch.completion_mask_BL.astype(bool)
    if mask_truncated_completions:
        mask_BL = mask_BL & ~batch.truncated_B.astype(bool)[:, None]
    return mask_BL


def batch_objective(model: Transformer, batch: GRPOBatch, cfg: GRPOTrainConfig,
                    num_items_in_batch: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """GRPO loss of one (micro-)batch under `model`, with TRL's metrics plus `entropy`."""
    mask_BL = loss_mask(batch, cfg.mask_truncated_completions)
    logp_BL, entropy_BL = policy_logps(model, batch.input_ids_BT, batch.attention_mask_BT, cfg.temperature)
    ref_logp_BL = batch.ref_logp_BL if cfg.beta != 0.0 else None
    loss, metrics = grpo_loss(logp_BL, batch.old_logp_BL, ref_logp_BL, batch.advantages_B, mask_BL, cfg,
                              num_items_in_batch)
    metrics["entropy"] = masked_mean(entropy_BL, mask_BL)
    return loss, metrics


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg"))
def _value_and_grad(graphdef: nnx.GraphDef, params: Params, rest: nnx.State, batch: GRPOBatch,
                    cfg: GRPOTrainConfig) -> tuple[tuple[Array, dict[str, Array]], Params]:
    def objective(params: Params) -> tuple[Array, dict[str, Array]]:
        return batch_objective(nnx.merge(graphdef, params, rest), batch, cfg)

    return jax.value_and_grad(objective, has_aux=True)(params)


def loss_and_grads(model: Transformer, batch: GRPOBatch, cfg: GRPOTrainConfig
                   ) -> tuple[Array, dict[str, Array], Params]:
    """Loss, metrics and d loss / d params (a pure dict shaped like the params) of one whole batch."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = jax.tree.map(jnp.asarray, batch)
    (loss, metrics), grads = _value_and_grad(graphdef, nnx.to_pure_dict(params), rest, batch, cfg)
    return loss, metrics, grads


# ----------------------------------------------------------------------------- the train step


def _micro_batches(batch: GRPOBatch, n: int, sharding: jax.sharding.Sharding | None) -> GRPOBatch:
    """[B, ...] -> [n, B / n, ...] with micro-batch k = rows k, k + n, ... (stays evenly sharded)."""
    def split(x: Array) -> Array:
        x = jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)
    return jax.tree.map(split, batch)


def make_train_step(graphdef: nnx.GraphDef, rest: nnx.State, cfg: GRPOTrainConfig,
                    optimizer: optax.GradientTransformation,
                    micro_batch_sharding: jax.sharding.Sharding | None = None
                    ) -> Callable[[TrainState, GRPOBatch], tuple[TrainState, dict[str, Array]]]:
    """The un-jitted step: accumulate gradients over micro-batches, clip, AdamW-update (skipped if non-finite)."""
    n = cfg.gradient_accumulation_steps
    weight = 1.0 if cfg.loss_type == "dapo" else 1.0 / n      # dapo already divides by the global count
    schedule = make_schedule(cfg)

    def micro_loss(params: Params, micro: GRPOBatch, num_items: Array) -> tuple[Array, dict[str, Array]]:
        loss, metrics = batch_objective(nnx.merge(graphdef, params, rest), micro, cfg, num_items)
        return loss * weight, metrics

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def step(state: TrainState, batch: GRPOBatch) -> tuple[TrainState, dict[str, Array]]:
        num_items = loss_mask(batch, cfg.mask_truncated_completions).sum().astype(jnp.float32)

        def accumulate(grads: Params, micro: GRPOBatch) -> tuple[Params, tuple[Array, dict[str, Array]]]:
            (loss, metrics), g = grad_fn(state.params, micro, num_items)
            return jax.tree.map(jnp.add, grads, g), (loss, metrics)

        if n == 1:     # no accumulation buffer, no loop
            (loss, metrics), grads = grad_fn(state.params, batch, num_items)
            losses, metrics = loss[None], jax.tree.map(lambda x: x[None], metrics)
        else:
            zeros = jax.tree.map(jnp.zeros_like, state.params)
            grads, (losses, metrics) = jax.lax.scan(accumulate, zeros, _micro_batches(batch, n, micro_batch_sharding))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {k: v.mean() for k, v in metrics.items()}   # TRL averages per-micro-batch metrics
        metrics.update(loss=losses.sum(), grad_norm=optax.tree.norm(grads),
                       learning_rate=schedule(state.step), loss_tokens=num_items)
        # A non-finite loss or gradient applies nothing (params, moments and step stay as they were).
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        new_state = TrainState(state.step + 1, params, opt_state)
        return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state), metrics

    return step


# ----------------------------------------------------------------------------- the learner


def configure_model(model: Transformer, compute_dtype: str | None, remat: bool | None) -> Transformer:
    """A view of `model` (sharing its arrays) with another compute dtype and/or remat setting."""
    copy = nnx.merge(*nnx.split(model))
    if compute_dtype is not None:
        copy.dtype = jnp.dtype(compute_dtype)
    if remat is not None:
        copy.remat = remat
    return copy


RefModel = Transformer | Callable[[], Transformer] | None


class GRPOLearner:
    """Holds the policy's train state (and, only when beta != 0, frozen reference parameters).

    `model`'s compute dtype and `remat` flag apply unless `cfg.compute_dtype` / `cfg.remat` override them;
    parameters stay in their (fp32) dtype and are what the optimiser updates.
    `ref_model` (a model or a zero-argument loader) is touched only when `cfg.beta != 0`; by
    default the reference is a frozen copy of the initial policy. With a `mesh`, the batch is split
    over its "data"/"fsdp" axes and parameters (and Adam moments) are FSDP-sharded over "fsdp".
    """

    def __init__(self, model: Transformer, cfg: GRPOTrainConfig, *, mesh: Mesh | None = None,
                 ref_model: RefModel = None, fsdp_min_size: int = 2**14):
        self.cfg, self.mesh = cfg, mesh
        model = configure_model(model, cfg.compute_dtype, cfg.remat)
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        params = nnx.to_pure_dict(params)
        self.optimizer = make_optimizer(cfg)
        self.batch_axes = tuple(a for a in BATCH_AXES if mesh is not None and a in mesh.axis_names)
        micro_sharding = None
        if mesh is not None:
            micro_sharding = NamedSharding(mesh, P(None, self.batch_axes))
            param_shardings = (fsdp_shardings(params, mesh, "fsdp", fsdp_min_size) if "fsdp" in mesh.axis_names
                               else jax.tree.map(lambda _: replicated(mesh), params))
            params = jax.device_put(params, param_shardings)
        opt_state = jax.jit(self.optimizer.init)(params)
        if mesh is not None:   # moments follow the params' sharding; step counters start on one device
            opt_state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else
                                     jax.device_put(x, replicated(mesh)), opt_state)
        step0 = jnp.zeros((), jnp.int32) if mesh is None else jax.device_put(jnp.zeros((), jnp.int32),
                                                                             replicated(mesh))
        self.state = TrainState(step0, params, opt_state)
        state_shardings = jax.tree.map(lambda x: x.sharding, self.state) if mesh is not None else None
        step = make_train_step(self.graphdef, self.rest, cfg, self.optimizer, micro_sharding)
        self._step = jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, None))
        self._score = jax.jit(self._score_fn, static_argnums=0)
        self.ref = self._init_ref(ref_model, params) if cfg.beta != 0.0 else None

    def _init_ref(self, ref_model: RefModel, params: Params) -> tuple[nnx.GraphDef, Params, nnx.State]:
        if ref_model is None:
            return self.graphdef, jax.tree.map(jnp.copy, params), self.rest
        model = ref_model if isinstance(ref_model, Transformer) else ref_model()
        graphdef, ref_params, rest = nnx.split(model, nnx.Param, ...)
        ref_params = jax.tree.map(lambda x, p: jax.device_put(x, p.sharding), nnx.to_pure_dict(ref_params), params)
        return graphdef, ref_params, rest

    def _score_fn(self, graphdef: nnx.GraphDef, params: Params, rest: nnx.State, input_ids_BT: Array,
                  attention_mask_BT: Array) -> Array:
        model = nnx.merge(graphdef, params, rest)
        return policy_logps(model, input_ids_BT, attention_mask_BT, self.cfg.temperature)[0]

    @property
    def model(self) -> Transformer:
        """The current policy as an NNX module sharing the train state's arrays (which the next `step`
        donates: take a fresh `model` after every step, e.g. for the next rollout)."""
        return nnx.merge(self.graphdef, self.state.params, self.rest)

    def shard(self, batch: GRPOBatch) -> GRPOBatch:
        """Place a host batch on the mesh (split over the batch axes), or on the default device."""
        n, b = self.cfg.gradient_accumulation_steps, np.shape(batch.advantages_B)[0]
        shards = 1 if self.mesh is None else int(np.prod([self.mesh.shape[a] for a in self.batch_axes]))
        if b % (n * shards):
            raise ValueError(f"batch of {b} does not split into {n} micro-batches over {shards} devices")
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, batch)
        return jax.device_put(batch, NamedSharding(self.mesh, P(self.batch_axes)))

    def prepare(self, batch: GRPOBatch) -> GRPOBatch:
        """Shard the batch and add what the loss needs: old log-probs (mu > 1), reference log-probs (beta)."""
        batch = self.shard(batch)
        ids, mask = batch.input_ids_BT, batch.attention_mask_BT
        if self.cfg.num_iterations > 1 and batch.old_logp_BL is None:
            batch = batch.replace(old_logp_BL=self._score(self.graphdef, self.state.params, self.rest, ids, mask))
        if self.ref is not None and batch.ref_logp_BL is None:
            graphdef, params, rest = self.ref
            batch = batch.replace(ref_logp_BL=self._score(graphdef, params, rest, ids, mask))
        return batch

    def step(self, batch: GRPOBatch) -> dict[str, float]:
        """One optimiser step on a prepared batch; returns host metrics."""
        self.state, metrics = self._step(self.state, batch)
        return {k: float(v) for k, v in metrics.items()}

    def train_on_rollout(self, batch: GRPOBatch) -> list[dict[str, float]]:
        """`num_iterations` optimiser steps on one rollout (old log-probs stored before the first)."""
        batch = self.prepare(batch)
        return [self.step(batch) for _ in range(self.cfg.num_iterations)]
