"""The per-device memory of a GRPO epoch on a (data, fsdp) mesh (terms described in
`jaxcore.runtime.memory`), and the plan of a GRPO job config (`jaxcore plan`, the start-up check)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from jaxcore.errors import UserError
from jaxcore.grpo import packing
from jaxcore.grpo.config import GRPOConfig
from jaxcore.hf.peft import target_paths
from jaxcore.inference.generate import bucket_length
from jaxcore.model.config import ModelConfig
from jaxcore.model.lora import LoRAConfig
from jaxcore.runtime.memory import (
    MemoryPlan,
    fsdp_bytes,
    itemsize,
    kv_cache_bytes,
    param_shapes,
    planned_platform,
    prefill_activation_bytes,
)
from jaxcore.runtime.plan_check import prompt_tokens_of

GRPO_ADVICE = {
    "master weights": "raise grpo.fsdp or train LoRA adapters (grpo.lora)",
    "compute weights": "raise grpo.fsdp",
    "optimizer state": "raise grpo.fsdp or train LoRA adapters (grpo.lora)",
    "reference model": "set grpo.beta=0, raise grpo.fsdp or use grpo.lora (its reference is the base)",
    "gradients": "raise grpo.fsdp or train LoRA adapters (grpo.lora)",
    "kv cache": "lower rollout.prompts_per_epoch, rollout.generations_per_prompt or rollout.max_new_tokens "
                "(rollout.max_episode_tokens with tools) or the prompt length, or use more devices",
    "generation activations": "lower rollout.prompts_per_epoch or rollout.generations_per_prompt",
    "activations": "raise grpo.steps_per_generation / grpo.gradient_accumulation_steps (smaller micro-batches), "
                   "set model.remat=true, or lower rollout.max_new_tokens (rollout.max_episode_tokens with tools)",
    "scoring activations": "raise grpo.steps_per_generation or lower rollout.prompts_per_epoch",
}


CPU_ACTIVATIONS_ADVICE = ("raise grpo.steps_per_generation / grpo.gradient_accumulation_steps (smaller "
                          "micro-batches) or lower rollout.max_new_tokens (rollout.max_episode_tokens with tools) or "
                          "the prompt length (model.remat saves no memory on CPU with model.scan_layers=false)")


def remat_saves(scan: bool = True) -> bool:
    """Whether model.remat lowers XLA:CPU's train-step memory. With the layers scanned, yes (a layer's recomputation
    can only run inside the scan's backward). Unscanned, no: XLA:CPU schedules each block's recomputation with the
    forward, so its temp bytes are about those without remat. (On a GPU it always does.)"""
    return scan


def saved_per_token_scanned(cfg: ModelConfig, seq: int, c: int) -> float:
    """Bytes a scanned layer keeps for the backward per token of a `seq`-token row: its input, and the outputs of its
    GEMMs only (the scan's checkpoint policy recomputes the rest): q/k/v, the fp32 attention scores over `seq` keys
    and the fp32 attention output, the output projection, gate/up and down."""
    d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, k = cfg.num_heads, cfg.num_kv_heads
    return c * (h * e + 2 * k * e + 3 * d + 2 * f) + 4 * h * (seq + e)


def saved_per_token(cfg: ModelConfig, seq: int, c: int) -> float:
    """Bytes one layer keeps for the backward per token of a `seq`-token row (compute dtype of `c` bytes): norms
    (fp32 and compute), q/k/v, RoPE'd q/k (fp32), attention output, MLP input, gate/up/product; and per head
    over the `seq` keys, the fp32 softmax numerators and, in a lower compute dtype, the copy the value product
    reads (`grouped_attention`: XLA:CPU keeps one fp32 [B, H, T, S] array per layer in an fp32 step, as measured;
    it kept three with `jax.nn.dot_product_attention`: masked scores, probabilities and their copy)."""
    d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, k = cfg.num_heads, cfg.num_kv_heads
    scores = 4 + (c if c != 4 else 0)
    return c * (6 * d + 2 * h * e + 4 * k * e + 3 * f) + 4 * (2 * d + 2 * (h + k) * e) + h * seq * scores


def cpu_activations(cfg: ModelConfig, rows: int, seq: int, new_tokens: int, c: int, remat: bool, scan: bool,
                    adapters: float | None, head_positions: int | None = None) -> float:
    """Bytes XLA:CPU's train step holds beyond the parameters, moments and gradients, for `rows` rows of `seq`
    tokens (`new_tokens` of them completions, or, packed, every slot) in a compute dtype of `c` bytes; `adapters`:
    LoRA's, else None; `head_positions`: where the LM head runs (default rows * new_tokens)."""
    per_token = saved_per_token(cfg, seq, c)
    if remat and scan:      # each layer's input is kept; the layer recomputed in the backward holds its GEMMs'
        # outputs and, as measured on XLA:CPU, about half of its elementwise intermediates
        recomputed = (saved_per_token_scanned(cfg, seq, c) + per_token) / 2
        saved = rows * seq * (cfg.num_layers * cfg.hidden_size * c + recomputed)
    elif remat and remat_saves(scan):   # only each block's input is kept; one block is recomputed at a time
        saved = rows * seq * (cfg.num_layers * cfg.hidden_size * c + per_token)
    elif scan:      # the scanned layers keep their GEMMs' outputs; the last layer, apart, at the completion positions
        saved = rows * (seq * (cfg.num_layers - 1) * saved_per_token_scanned(cfg, seq, c) + new_tokens * per_token)
    else:       # the last layer keeps its query-side arrays at the completion positions only (nothing reads others)
        saved = rows * (seq * (cfg.num_layers - 1) + new_tokens) * per_token
    if scan:        # the scan's stacks of per-layer trainable weights: their gradients, and the slices it keeps
        block_params = cfg.num_layers * sum(math.prod(s) for p, s in param_shapes(cfg).items()
                                            if p.startswith("blocks.0."))
        saved += 2 * (adapters if adapters is not None else 4 * block_params)
    # the LM head runs only at the completion positions: fp32 logits, their exponential and their gradient
    return saved + 3 * (rows * new_tokens if head_positions is None else head_positions) * cfg.vocab_size * 4


def gpu_activations(cfg: ModelConfig, rows: int, seq: int, new_tokens: int, c: int, remat: bool,
                    trainable: float, head_positions: int | None = None) -> float:
    """`cpu_activations` for XLA:GPU, scanned or not: every layer keeps its GEMMs' outputs (the last layer at the
    completion positions only), or with remat its input, while one layer is recomputed; no layer's weights are
    kept in the compute dtype. The peak is the LM head's backward (two fp32 logit arrays and the head's weight in
    the compute dtype, before any of the `trainable` bytes of gradients exists) or the layers' backward (the
    gradients, and the logits' gradient in the compute dtype, kept for the head's own gradient until the layers are
    done), whichever is larger."""
    layer = saved_per_token_scanned(cfg, seq, c)
    if remat:
        saved = rows * seq * (cfg.num_layers * cfg.hidden_size * c + layer)
    else:
        saved = rows * (seq * (cfg.num_layers - 1) + new_tokens) * layer
    head_outputs = (rows * new_tokens if head_positions is None else head_positions) * cfg.vocab_size
    return saved + max(2 * head_outputs * 4 + cfg.vocab_size * cfg.hidden_size * c - trainable, head_outputs * c)


def _lora_paths(cfg: ModelConfig, target_modules: tuple[str, ...] | str) -> list[str]:
    try:
        return sorted(target_paths(SimpleNamespace(config=cfg), LoRAConfig(target_modules=target_modules)))
    except ValueError as err:
        raise UserError(str(err)) from None


def plan_grpo(cfg: ModelConfig, *, prompts: int, generations: int, prompt_tokens: int, max_new_tokens: int,
              devices: int, fsdp: int = 1, compute_dtype: str = "float32", beta: float = 0.0,
              lora_rank: int | None = None, lora_targets: tuple[str, ...] | str = ("q_proj", "v_proj"),
              lora_base_dtype: str | None = None, remat: bool = False, micro_batches: int = 1,
              accumulation: int = 1, scoring: bool = False, device_memory: float | None = None,
              cache_tokens: int | None = None, scan: bool = True, platform: str | None = None,
              share_prompts: bool = False, token_budget: int | None = None) -> MemoryPlan:
    """The per-device memory of one GRPO epoch (rollout, then the optimiser steps). `max_new_tokens` is the
    completion's length (a multi-turn episode's: `RolloutConfig.completion_tokens`), `cache_tokens` the KV-cache
    slots after the prompt (default: as many); `micro_batches` is TRL's steps_per_generation (each
    forward/backward sees rows / micro_batches); `scoring`: a forward over the whole rollout for old or
    reference log-probs; `scan`: the train step scans the layers (`model.scan_layers`); `platform`: the backend the
    run compiles for (`planned_platform`), as XLA:CPU and XLA:GPU keep different buffers in the train step;
    `share_prompts` / `token_budget`: the forwards run packed prefix trees (`jaxcore.grpo.packing.planned_shape`)."""
    platform = planned_platform(platform)
    cpu = platform == "cpu"
    shapes = param_shapes(cfg)
    c = itemsize(compute_dtype, "model.dtype")
    base_bytes = itemsize(lora_base_dtype, "grpo.lora.base_dtype") if lora_rank and lora_base_dtype else 4
    count = sum(math.prod(s) for s in shapes.values())
    base = sum(fsdp_bytes(s, fsdp, base_bytes) for s in shapes.values())
    # the weights a forward reads: a compute-dtype cast, and all-gathered over fsdp (whole, as an upper bound)
    gathered = count * c if (c != base_bytes or fsdp > 1) else 0.0
    if lora_rank:
        adapters = sum(lora_rank * sum(shapes[p]) * 4 for p in _lora_paths(cfg, lora_targets))   # replicated
        trainable, reference = adapters, 0.0
    else:
        adapters, trainable = 0.0, sum(fsdp_bytes(s, fsdp, 4) for s in shapes.values())
        reference = base if beta != 0.0 else 0.0
    moments = 2 * trainable          # AdamW's two moments, sharded like the trainable parameters
    gen_rows = math.ceil(prompts * generations / devices)
    t_prompt = bucket_length(prompt_tokens)
    seq = t_prompt + max_new_tokens
    rows = math.ceil(prompts * generations / (devices * micro_batches))
    head = rows * max_new_tokens                # the LM head's positions: every completion token
    step_rows, step_seq, step_tokens = rows, seq, max_new_tokens
    if share_prompts or token_budget is not None:       # packed rows, every slot through the last layer
        step_rows, step_seq = packing.planned_shape(cfg, rows * devices * micro_batches, generations, micro_batches,
                                                    devices, t_prompt, max_new_tokens,
                                                    token_budget)
        step_tokens = step_seq
    per_token = saved_per_token(cfg, step_seq, c)
    if cpu:
        activations = cpu_activations(cfg, step_rows, step_seq, step_tokens, c, remat, scan,
                                      adapters if lora_rank else None, head)
    else:
        activations = gpu_activations(cfg, step_rows, step_seq, step_tokens, c, remat, trainable, head)
    score_rows = gen_rows if scoring else 0
    score_packed = step_rows * micro_batches if scoring else 0
    terms = {"master weights": base + adapters, "compute weights": gathered, "optimizer state": moments,
             "reference model": reference,
             "kv cache": kv_cache_bytes(cfg, gen_rows, t_prompt + (cache_tokens or max_new_tokens), c),
             "generation activations": prefill_activation_bytes(cfg, gen_rows, t_prompt, c),
             "gradients": trainable * (2 if accumulation > 1 else 1),
             "activations": activations,
             "scoring activations": 2 * score_rows * max_new_tokens * cfg.vocab_size * 4
                                    + score_packed * step_seq * per_token}
    # XLA:GPU casts each weight where the step reads it: the whole compute copy is the rollout's alone
    generation = ("kv cache", "generation activations") if cpu else ("compute weights", "kv cache",
                                                                     "generation activations")
    phases = {"generation": generation, "training": ("gradients", "activations"), "scoring": ("scoring activations",)}
    advice = {**GRPO_ADVICE, **({} if remat_saves(scan) or not cpu else {"activations": CPU_ACTIVATIONS_ADVICE})}
    return MemoryPlan(terms, devices, 1, device_memory, 0, phases, "grpo", f"data={devices // fsdp} fsdp={fsdp}",
                      advice, platform)


def plan_job(grpo_cfg: GRPOConfig, model_cfg: ModelConfig, *, devices: int, device_memory: float | None = None,
             prompt_tokens: int | None = None, prompts: int | None = None, platform: str | None = None) -> MemoryPlan:
    """`plan_grpo` for a `jaxcore grpo` job config (`GRPOConfig`): completions as long as a rollout row's can be
    (`rollout.completion_tokens`: with tools, a whole episode), micro-batches are its steps_per_generation,
    and the whole rollout is scored for reference log-probs (beta) or old ones from the learner's forward."""
    g, r = grpo_cfg.grpo, grpo_cfg.rollout
    lora = g.lora
    return plan_grpo(model_cfg, prompts=prompts or r.prompts_per_epoch, generations=r.generations_per_prompt,
                     prompt_tokens=prompt_tokens_of(grpo_cfg, prompt_tokens), max_new_tokens=r.completion_tokens,
                     cache_tokens=r.cache_tokens,
                     devices=devices, fsdp=g.fsdp, compute_dtype=grpo_cfg.model.dtype, beta=g.beta,
                     lora_rank=max([lora.rank, *lora.rank_pattern.values()]) if lora else None,
                     lora_targets=(lora.target_modules if isinstance(lora.target_modules, str) else
                                   tuple(lora.target_modules)) if lora else (),
                     lora_base_dtype=lora.base_dtype if lora else None, remat=grpo_cfg.model.remat,
                     micro_batches=g.generation_steps, accumulation=g.gradient_accumulation_steps,
                     scoring=g.beta != 0.0 or grpo_cfg.old_logp_source == "forward", device_memory=device_memory,
                     scan=grpo_cfg.model.scan_layers, platform=platform, share_prompts=g.share_prompts,
                     token_budget=g.token_budget)
