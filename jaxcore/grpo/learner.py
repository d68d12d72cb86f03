"""`GRPOLearner`: the GRPO train state, its reference model, and the loop over one rollout.

    learner = GRPOLearner(jaxcore.load_hf(path), cfg, mesh=grpo_mesh())       # cfg: a GRPOConfig
    batch = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, eos_ids)
    metrics = learner.train_on_rollout(batch)

One rollout is split into `steps_per_generation / gradient_accumulation_steps` optimiser steps
(strided row slices), and the whole split is passed over `num_iterations` times, as TRL's buffered
generation batch is, stopping at the first non-finite step (not applied); old log-probs are stored before
the first step whenever a step can see a policy other than the one that sampled (`cfg.old_logp_source`).
With `cfg.grpo.lora`, the trainable parameters are only the adapters (`jaxcore.model.lora`) over the frozen
base, and the reference model is that base (no copy); a model holding LoRA stand-ins (a peft model's adapter,
`lora.lora_model`) continues training them, with a copy of them as the reference, as TRL's "ref" adapter.
With `sync_ref_model`, every `ref_model_sync_steps` optimiser steps the reference parameters become
alpha * policy + (1 - alpha) * reference (TRL's SyncRefModelCallback).
With `cfg.model.scan_layers` (the default) the train state holds the blocks stacked (`jaxcore.model.layer_stack`)
and every training program scans them, so tracing and compiling cost the same at any depth; the rollout's model,
checkpoints and exports are per layer, as everywhere else.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcore.grpo import packing
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.step import (
    GRPOBatch,
    Params,
    TrainState,
    _micro_batches,
    completion_logps,
    loss_mask,
    make_train_step,
)
from jaxcore.hf import peft
from jaxcore.model import layer_stack, lora
from jaxcore.model.state import module_copy
from jaxcore.model.transformer import Transformer
from jaxcore.parallel.config import SHARD_MIN_SIZE
from jaxcore.parallel.meshes import FSDP, batch_axes_of, replicated
from jaxcore.parallel.sharding import fsdp_spec, optimizer_state_shardings
from jaxcore.runtime.optim import make_optimizer

log = logging.getLogger(__name__)
RefModel = Transformer | Callable[[], Transformer] | None


def fsdp_layer_shardings(params: Params, mesh: Mesh, min_size: int) -> Any:
    """FSDP shardings over "fsdp" for parameters in either layout: a stacked leaf is split as each of its layers
    would be (never along the layer axis, which the scan walks)."""
    def sharding(path: tuple[Any, ...], x: jax.Array) -> NamedSharding:
        layers = layer_stack.layer_axes(path)
        spec = fsdp_spec(tuple(x.shape[layers:]), FSDP, mesh.shape[FSDP], min_size)
        return NamedSharding(mesh, P(*([None] * layers), *spec))
    return jax.tree_util.tree_map_with_path(sharding, params)


def configure_model(model: Transformer, compute_dtype: str | None, remat: bool | None) -> Transformer:
    """A view of `model` (sharing its arrays) with another compute dtype and/or remat setting."""
    copy = module_copy(model)
    if compute_dtype is not None:
        copy.dtype = jnp.dtype(compute_dtype)
    if remat is not None:
        copy.remat = remat
    return copy


class GRPOLearner:
    """Holds the policy's train state (and, only when grpo.beta != 0, frozen reference parameters) for the
    job config `cfg`: the loss and rollout split are `cfg.grpo`, the optimiser `cfg.optimizer` over
    `cfg.total_steps`, the log-probs' temperature `cfg.rollout.temperature`, the LoRA seed `cfg.train.seed`.

    `model`'s compute dtype and `remat` flag apply unless `compute_dtype` / `remat` override them;
    parameters stay in their (fp32) dtype and are what the optimiser updates.
    `ref_model` (a model or a zero-argument loader) is touched only when `cfg.grpo.beta != 0`; by
    default the reference is a frozen copy of the initial policy (with LoRA: the base itself). With a
    `mesh`, the batch is split over its "data"/"fsdp" axes and parameters (and Adam moments) are
    FSDP-sharded over "fsdp".
    """

    def __init__(self, model: Transformer, cfg: GRPOConfig, *, mesh: Mesh | None = None,
                 ref_model: RefModel = None, compute_dtype: str | None = None, remat: bool | None = None,
                 fsdp_min_size: int = SHARD_MIN_SIZE, keep_params: bool = False):
        self.cfg, self.mesh = cfg, mesh
        g = cfg.grpo
        model, initial, initial_scalings = lora.split_adapters(configure_model(model, compute_dtype, remat))
        if initial and g.lora is None:
            raise ValueError("the model holds LoRA adapters (a peft model): grpo.lora (their config) trains them")
        if g.lora is not None:
            model = lora.frozen_base(model, g.lora)
        self.num_layers, self.model_config = model.config.num_layers, model.config
        self.layer_scalings = None if g.lora is None else peft.adapter_scalings(model, g.lora)   # per-layer paths
        if g.lora is None:
            adapters = None
        elif initial:           # a peft model's adapter: training continues it
            expected = jax.eval_shape(lambda: peft.init_peft_adapters(model, g.lora, jax.random.key(0)))
            _check_continued(initial, initial_scalings, expected, self.layer_scalings)
            adapters = initial
        else:
            adapters = peft.init_peft_adapters(model, g.lora, jax.random.key(cfg.train.seed))
        self.scanned = cfg.model.scan_layers and self._stackable(adapters)
        self.scalings = (lora.stacked_scalings(self.layer_scalings, self.num_layers)
                         if self.scanned and g.lora is not None else self.layer_scalings)
        if self.scanned:
            model = layer_stack.scanned(model)
        self.graphdef, base, self.rest = nnx.split(model, nnx.Param, ...)
        base = nnx.to_pure_dict(base)
        abstract = is_abstract(base)            # shapes only: the learner makes programs and holds no weights
        self.optimizer = make_optimizer(cfg.optimizer, cfg.total_steps, decay_mask=layer_stack.layer_matrices)
        self.batch_axes = () if mesh is None else batch_axes_of(mesh)
        self.micro_sharding = None
        if mesh is not None:
            self.micro_sharding = NamedSharding(mesh, P(None, self.batch_axes))
            shardings = (fsdp_layer_shardings(base, mesh, fsdp_min_size) if FSDP in mesh.axis_names
                         else jax.tree.map(lambda _: replicated(mesh), base))
            base = placed(base, shardings, abstract)
        if adapters is None:
            params, self.frozen = base, None
        else:
            params = self.to_training_layout(adapters)
            if mesh is not None:
                params = placed(params, jax.tree.map(lambda _: replicated(mesh), params), abstract)
            self.frozen = base
        opt_shardings = None if mesh is None else optimizer_state_shardings(self.optimizer, params, mesh)
        opt_state = initialised(self.optimizer.init, params, opt_shardings)     # moments like the params
        step0 = jnp.zeros((), jnp.int32)
        if mesh is not None:
            step0 = placed(step0, replicated(mesh), abstract)
        control = (jnp.asarray([cfg.grpo.entropy_coef, jnp.inf], jnp.float32) if cfg.grpo.use_adaptive_entropy
                   else None)                     # TRL's controller: no bonus before a step's entropy is known
        if control is not None and mesh is not None:
            control = placed(control, replicated(mesh), abstract)
        self.state = TrainState(step0, params, opt_state, control)
        state_shardings = jax.tree.map(lambda x: x.sharding, self.state) if mesh is not None else None
        self.state_shardings = state_shardings
        self.abstract_state = _abstract(self.state)     # what every step sees (the thread making programs reads it)
        step = make_train_step(self.build, cfg, self.optimizer, self.micro_sharding)
        # `keep_params` (asynchronous GRPO in one process, whose weight sync reads a version's params on a thread of
        # its own while the next steps run): the steps leave the params they are given intact, at the cost of one
        # more copy of them at the step's peak (the rest of the state is donated, as always)
        self.keeps_params = keep_params
        if self.keeps_params:
            self._step = jax.jit(_keeping_params(step), donate_argnums=1, out_shardings=(state_shardings, None))
        else:
            self._step = jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, None))
        self._score = jax.jit(self._score_fn, static_argnums=0)       # graphdef
        self._mix = jax.jit(lambda ref, pol, a: jax.tree.map(lambda r, p: (a * p + (1 - a) * r).astype(r.dtype),
                                                             ref, pol))
        self._split = jax.jit(lambda b: _micro_batches(b, g.steps_per_rollout, self.micro_sharding))
        # TRL's reference for a peft model is a copy of its adapter (on the same base): adapters, not a model
        self.ref_is_adapters = bool(initial) and ref_model is None and g.beta != 0.0
        if self.ref_is_adapters:
            copy = (lambda x: x) if abstract else jnp.copy
            self.ref = None, jax.tree.map(copy, params), None
        else:
            self.ref = self._init_ref(ref_model, base) if g.beta != 0.0 else None

    def _stackable(self, adapters: Any) -> bool:
        """Whether the blocks can train stacked: always without LoRA; with LoRA, when every adapted kind of kernel
        is adapted on every layer with one rank and one scaling (exclude_modules, rank_pattern or alpha_pattern can
        name single layers)."""
        if adapters is None:
            return True
        try:
            jax.eval_shape(lambda a: layer_stack.stack_paths(a, self.num_layers), adapters)
            lora.stacked_scalings(self.layer_scalings, self.num_layers)
        except ValueError as err:
            log.info("training the layers one by one (no scan): %s", err)
            return False
        return True

    def build(self, params: Params, frozen: Any, key: jax.Array | None = None) -> Transformer:
        """The policy module for trainable `params` (and, with LoRA, the frozen base `frozen`), in the training
        layout (`scanned`: blocks stacked)."""
        if self.cfg.grpo.lora is None:
            return nnx.merge(self.graphdef, params, self.rest)
        return lora.lora_model(nnx.merge(self.graphdef, frozen, self.rest), params, self.cfg.grpo.lora, key,
                               self.scalings)

    # -- between the training layout and the per-layer one ----------------------------------------------------

    def to_training_layout(self, params: Params) -> Params:
        """Trainable parameters (or a tree shaped like them) from the per-layer layout into the training one."""
        if not self.scanned:
            return params
        if self.cfg.grpo.lora is not None:
            return layer_stack.stack_paths(params, self.num_layers)
        return layer_stack.stack_params(params)

    def to_layer_layout(self, params: Params) -> Params:
        """The inverse of `to_training_layout`."""
        if not self.scanned:
            return params
        if self.cfg.grpo.lora is not None:
            return layer_stack.unstack_paths(params, self.num_layers)
        return layer_stack.unstack_params(params)

    def layer_state(self) -> tuple[TrainState, Params | None]:
        """The train state and the reference parameters (None without a reference) in the per-layer layout, as
        checkpoints store them (whatever the training layout)."""
        state, ref = self.state, None if self.ref is None else self.ref[1]
        if not self.scanned:
            return state, ref
        params = state.params
        state = TrainState(state.step, self.to_layer_layout(params),
                           layer_stack.map_like(self.to_layer_layout, state.opt_state, params), state.entropy_control)
        return state, None if ref is None else (self.to_layer_layout(ref) if self.ref_is_adapters
                                                else layer_stack.unstack_params(ref))

    def load_layer_state(self, state: TrainState, ref: Params | None = None) -> None:
        """Set the train state (and the reference parameters) from the per-layer layout of `layer_state`."""
        if self.scanned:
            params = state.params
            state = TrainState(state.step, self.to_training_layout(params),
                               layer_stack.map_like(self.to_training_layout, state.opt_state, params),
                               state.entropy_control)
            ref = None if ref is None else (self.to_training_layout(ref) if self.ref_is_adapters
                                            else layer_stack.stack_params(ref))
            if self.mesh is not None:
                state = jax.device_put(state, self.state_shardings)
                ref = None if ref is None else jax.device_put(ref, jax.tree.map(lambda x: x.sharding, self.ref[1]))
        self.state = state
        self.abstract_state = _abstract(state)
        if ref is not None:
            graphdef, _, rest = self.ref
            self.ref = graphdef, ref, rest

    def _init_ref(self, ref_model: RefModel, base: Params) -> tuple[nnx.GraphDef, Params, nnx.State]:
        if ref_model is None:
            copy = (lambda x: x) if is_abstract(base) else jnp.copy
            return self.graphdef, (base if self.cfg.grpo.lora is not None else jax.tree.map(copy, base)), self.rest
        model = ref_model if isinstance(ref_model, Transformer) else ref_model()
        if self.scanned:
            model = layer_stack.scanned(model)
        graphdef, ref_params, rest = nnx.split(model, nnx.Param, ...)
        ref_params = placed(nnx.to_pure_dict(ref_params), jax.tree.map(lambda p: p.sharding, base), is_abstract(base))
        return graphdef, ref_params, rest

    def _ref_frozen(self) -> Any:
        """The base the reference's adapters apply to (`ref_is_adapters`), else None (the reference is a model)."""
        return self.frozen if self.ref_is_adapters else None

    def _score_fn(self, graphdef: nnx.GraphDef, params: Params, rest: nnx.State, batch: GRPOBatch,
                  frozen: Any = None) -> jax.Array:
        """Log-probs [B, T-1] of the policy (graphdef None) or the reference; the LM head runs only from the
        batch's `completion_start` on, and the positions before it (the prompt's, masked out of the loss) are 0."""
        model = self.build(params, frozen) if graphdef is None else nnx.merge(graphdef, params, rest)
        logp_BL = completion_logps(model, batch, self.cfg.rollout.temperature)[0]
        return jnp.pad(logp_BL, ((0, 0), (batch.completion_start, 0)))

    @property
    def model(self) -> Transformer:
        """The current policy as an NNX module with per-layer blocks (what decoding runs), sharing the train
        state's arrays when it trains per layer (which the next `step` donates: take a fresh `model` after every
        step, e.g. for the next rollout), else a per-layer copy of them. With LoRA, the base with adapter
        stand-ins (what training evaluates)."""
        return layer_stack.unrolled(self.build(self.state.params, self.frozen))

    def _layer_base(self) -> Transformer:
        """The frozen LoRA base with per-layer blocks."""
        return layer_stack.unrolled(nnx.merge(self.graphdef, self.frozen, self.rest))

    def export_model(self) -> Transformer:
        """The policy with plain weights (LoRA: merged, ``w + scaling * a @ b`` in fp32), for `save_hf`."""
        if self.cfg.grpo.lora is None:
            return self.model
        return lora.merged_model(self._layer_base(), self.to_layer_layout(self.state.params), self.cfg.grpo.lora,
                                 scalings=self.layer_scalings)

    def save_adapter(self, out_dir: str, base_model_path: str = "") -> Any:
        """Write the LoRA adapters as a peft directory."""
        if self.cfg.grpo.lora is None:
            raise ValueError("save_adapter needs a LoRA learner (cfg.grpo.lora)")
        return peft.save_adapter(self._layer_base(), self.to_layer_layout(self.state.params), self.cfg.grpo.lora,
                                 out_dir, base_model_path)

    def shard(self, batch: GRPOBatch) -> GRPOBatch:
        """Place a host batch on the mesh (split over the batch axes), or on the default device, with its tokens
        packed as prefix trees where `grpo` asks for it (`packs`)."""
        n, b = self.cfg.grpo.generation_steps, np.shape(batch.advantages_B)[0]
        shards = self.batch_shards
        if b % (n * shards):
            raise ValueError(f"batch of {b} does not split into {n} micro-batches over {shards} devices")
        if self.cfg.grpo.packs and batch.trees is None:
            batch = batch.replace(trees=self.pack(batch))
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, batch)
        return jax.device_put(batch, NamedSharding(self.mesh, P(self.batch_axes)))

    @property
    def batch_shards(self) -> int:
        """How many devices the batch is split over."""
        return 1 if self.mesh is None else int(np.prod([self.mesh.shape[a] for a in self.batch_axes]))

    def pack(self, batch: GRPOBatch) -> packing.PackedTrees:
        """A host batch's tokens as prefix trees (`jaxcore.grpo.packing`): a tree per prompt and its completions at
        the bucket widths (as many completions per tree as cost least), or rows of `grpo.token_budget` slots."""
        g, p = self.cfg.grpo, batch.completion_start + 1
        ids, mask = np.asarray(batch.input_ids_BT), np.asarray(batch.attention_mask_BT)
        config, c = self.model_config, ids.shape[1] - p
        return packing.pack(ids[:, :p], mask[:, :p], ids[:, p:], mask[:, p:], pieces=g.generation_steps,
                            shards=self.batch_shards, tree=lambda group: packing.tree_size(config, p, c, group),
                            token_budget=g.token_budget, share_prompts=g.share_prompts,
                            group=self.cfg.rollout.generations_per_prompt)

    def prepare(self, batch: GRPOBatch) -> GRPOBatch:
        """Shard the batch and add what the loss needs: old log-probs when `cfg.old_logp_source` is not
        "none" and the batch has none (the learner's forward), reference log-probs (beta)."""
        batch = self.shard(batch)
        if self.cfg.old_logp_source != "none" and batch.old_logp_BL is None:
            batch = batch.replace(old_logp_BL=self._score(None, self.state.params, None, batch, self.frozen))
        if self.ref is not None and batch.ref_logp_BL is None:
            graphdef, params, rest = self.ref
            batch = batch.replace(ref_logp_BL=self._score(graphdef, params, rest, batch, self._ref_frozen()))
        return batch

    def make_programs(self, rows: int, prompt_width: int, completion_width: int, rollout_logprobs: bool) -> None:
        """Trace, lower and compile (or load from the persistent cache) every program that training on a rollout of
        `rows` completions of this shape runs (the scoring forwards of `prepare`, and the optimiser step), so that
        training on one makes none. Reads only shapes and shardings: safe on a background thread while the train
        state is in use. With several optimiser steps per rollout only the forwards are made (their split batches'
        layout is the step's first call's)."""
        batch = self.shard(self.placeholder_batch(rows, prompt_width, completion_width, rollout_logprobs))
        params, frozen = self.abstract_state.params, _abstract(self.frozen)

        def score(*args: Any) -> jax.ShapeDtypeStruct:
            lowered = self._score.lower(*args)
            compiled = lowered.compile()
            return jax.ShapeDtypeStruct(lowered.out_info.shape, lowered.out_info.dtype,
                                        sharding=compiled.output_shardings if self.mesh is not None else None)

        if self.cfg.old_logp_source != "none" and batch.old_logp_BL is None:
            batch = batch.replace(old_logp_BL=score(None, params, None, batch, frozen))
        if self.ref is not None:
            graphdef, ref_params, rest = self.ref
            batch = batch.replace(ref_logp_BL=score(graphdef, _abstract(ref_params), rest, batch,
                                                    _abstract(self._ref_frozen())))
        if self.cfg.grpo.steps_per_rollout != 1:
            return
        _, num_items = self.step_batches(batch)          # as a real rollout's: its small programs, its placement
        step = self.abstract_state.step
        key = None
        if self._uses_dropout():          # a key's small programs, on a step counter placed like the real one
            zero = jnp.zeros(step.shape, step.dtype)
            key = _abstract(self.dropout_key(zero if step.sharding is None else jax.device_put(zero, step.sharding)))
        self.lower_step(_abstract(batch), _abstract(num_items), key).compile()

    def placeholder_batch(self, rows: int, prompt_width: int, completion_width: int,
                          rollout_logprobs: bool = False) -> GRPOBatch:
        """A host batch of `rows` completions after `prompt_width` prompt columns, a prompt per group of
        `rollout.generations_per_prompt` rows (so that it packs as a rollout's does): the programs made ahead of a
        run, and the compile-only GPU suites, are made on it."""
        p, c = prompt_width, completion_width
        ones = np.ones((rows, p + c), np.int32)
        ids = ones * (np.arange(rows) // self.cfg.rollout.generations_per_prompt)[:, None]   # a prompt per group
        batch = GRPOBatch(ids, ones, ones[:, 1:], np.zeros(rows, np.float32), np.zeros(rows, bool),
                          completion_start=p - 1)
        if rollout_logprobs:
            batch = batch.replace(old_logp_BL=np.zeros((rows, p + c - 1), np.float32))
        return batch

    def lower_step(self, batch: GRPOBatch, num_items: Any, key: Any = None) -> Any:
        """The optimiser step lowered (not run) on a batch of abstract or real arrays, for the train state's
        shapes and shardings."""
        return self._step.lower(*self._state_args(self.abstract_state), _abstract(self.frozen), batch, num_items, key)

    def _state_args(self, state: TrainState) -> tuple[Any, ...]:
        """The train state as the step program takes it: whole (donated), or its params apart from the rest."""
        return (state.params, dataclasses.replace(state, params=None)) if self.keeps_params else (state,)

    def step_batches(self, batch: GRPOBatch) -> tuple[list[GRPOBatch], jax.Array]:
        """A prepared rollout's optimiser-step batches (step k: rows k, k + K, ...) and their dapo
        normaliser (TRL: the rollout's loss tokens / K)."""
        k = self.cfg.grpo.steps_per_rollout
        num_items = loss_mask(batch, self.cfg.grpo.mask_truncated_completions).sum().astype(jnp.float32) / k
        if k == 1:
            return [batch], num_items
        split = self._split(batch)
        return [jax.tree.map(lambda x, i=i: x[i], split) for i in range(k)], num_items

    def step(self, batch: GRPOBatch, num_items: jax.Array | None = None) -> dict[str, float]:
        """One optimiser step on a prepared batch; returns host metrics."""
        if num_items is None:
            num_items = loss_mask(batch, self.cfg.grpo.mask_truncated_completions).sum().astype(jnp.float32)
        key = self.dropout_key()
        before = int(self.state.step) if self.syncs_ref() else None   # read before the step donates it
        self.state, metrics = self._step(*self._state_args(self.state), self.frozen, batch, num_items, key)
        if before is not None:
            self.maybe_sync_ref(before)
        return {k: float(v) for k, v in metrics.items()}

    def dropout_key(self, step: jax.Array | None = None) -> jax.Array | None:
        """The LoRA dropout key of the optimiser step `step` (default: the next one); None without dropout."""
        if not self._uses_dropout():
            return None
        return jax.random.fold_in(jax.random.key(self.cfg.train.seed + 1), self.state.step if step is None else step)

    def _uses_dropout(self) -> bool:
        return self.cfg.grpo.lora is not None and self.cfg.grpo.lora.dropout > 0

    def syncs_ref(self) -> bool:
        return self.cfg.grpo.sync_ref_model and self.ref is not None

    def maybe_sync_ref(self, step_before: int) -> None:
        """TRL's SyncRefModelCallback (on_step_end at global_step % ref_model_sync_steps == 0): after a step
        that reached a multiple of `ref_model_sync_steps`, ref <- a * policy + (1 - a) * ref. A skipped
        (non-finite) step leaves `state.step` where it was and does not sync: it is no optimiser step,
        and syncing again at the same count (or at step 0) would mix twice."""
        cfg, step = self.cfg.grpo, int(self.state.step)
        if not self.syncs_ref() or step == step_before or step % cfg.ref_model_sync_steps:
            return
        graphdef, params, rest = self.ref
        self.ref = graphdef, self._mix(params, self.state.params, cfg.ref_model_mixup_alpha), rest

    def train_on_rollout(self, batch: GRPOBatch) -> list[dict[str, float]]:
        """`num_iterations` passes of `steps_per_rollout` optimiser steps over one rollout, stopping at the
        first non-finite one (which `step` does not apply; it is the last in the returned metrics)."""
        batches, num_items = self.step_batches(self.prepare(batch))
        steps: list[dict[str, float]] = []
        for _ in range(self.cfg.grpo.num_iterations):
            for step_batch in batches:
                steps.append(self.step(step_batch, num_items))
                if not finite(steps[-1]):
                    return steps
        return steps


def _check_continued(adapters: Any, scalings: Any, planned: Any, planned_scalings: Any) -> None:
    """Adapters to continue training must be those grpo.lora would make (`planned`, shapes will do): the same
    kernels, ranks and scalings; else one line naming the first that differs."""
    def layout(tree: Any, scale: Any) -> dict[str, Any]:
        return {p: (ab["a"].shape, ab["b"].shape, scale[p]) for p, ab in tree.items()}

    ours, theirs = layout(adapters, scalings), layout(planned, planned_scalings)
    differs = sorted(p for p in set(ours) | set(theirs) if ours.get(p) != theirs.get(p))
    if differs:
        raise ValueError(f"the model's LoRA adapters are not grpo.lora's: {differs[0]} differs in kernel, rank or "
                         "scaling")


def is_abstract(tree: Any) -> bool:
    """Whether `tree`'s arrays are shapes only (`jax.ShapeDtypeStruct`): a learner made from `abstract_model` holds
    no weights and only makes programs (e.g. to compile them for other devices: `jaxcore.bench.gpu_compile`)."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def placed(tree: Any, shardings: Any, abstract: bool) -> Any:
    """`jax.device_put(tree, shardings)`, or for an abstract learner the shapes carrying those placements."""
    if not abstract:
        return jax.device_put(tree, shardings)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def initialised(init: Callable[[Any], Any], params: Any, shardings: Any) -> Any:
    """`init(params)` placed at `shardings` (None: where JAX puts it); for abstract params, its shapes."""
    if not is_abstract(params):
        return jax.jit(init, out_shardings=shardings)(params)
    shapes = jax.eval_shape(init, params)
    return shapes if shardings is None else placed(shapes, shardings, True)


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and (for arrays committed to a placement) shardings of `tree`'s arrays, as a jitted call
    that took them would see them; other leaves as they are."""
    def one(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct) or not hasattr(x, "shape"):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if getattr(x, "committed", False) else None)
    return jax.tree.map(one, tree)


def finite(step: dict[str, float]) -> bool:
    """Whether an optimiser step was applied: its loss and gradient norm are finite and the step did not skip a
    non-finite update or new parameter value (`skipped`)."""
    return bool(np.isfinite(step["loss"]) and np.isfinite(step["grad_norm"]) and not step.get("skipped", 0.0))


def _keeping_params(step: Callable[..., Any]) -> Callable[..., Any]:
    """`step(state, ...)` taking the params apart from the rest of the state, so that a program can donate the rest
    and leave the params intact."""
    def stepped(params: Any, rest: TrainState, *args: Any) -> Any:
        return step(dataclasses.replace(rest, params=params), *args)
    return stepped
