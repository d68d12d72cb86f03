"""The per-device memory of an ES epoch on a (pop, model) mesh (terms described in `jaxcore.runtime.memory`),
and the plan of an ES job config (`jaxcore plan`, the start-up check)."""

from __future__ import annotations

import math

from jaxcore.es.config import ESConfig
from jaxcore.inference.generate import bucket_length
from jaxcore.model.config import ModelConfig
from jaxcore.model.parameters import is_embedding, is_lm_head
from jaxcore.parallel.config import SHARD_MIN_SIZE
from jaxcore.runtime.memory import (
    OPTIMIZER_COPIES,
    MemoryPlan,
    itemsize,
    kv_cache_bytes,
    master_divisors,
    param_shapes,
    planned_platform,
    prefill_activation_bytes,
    split_divisors,
)
from jaxcore.runtime.plan_check import prompt_tokens_of

ES_ADVICE = {
    "compute weights": "raise mesh.model (each device then holds 1/mesh.model of every weight)",
    "master weights": "use more devices or es.master_dtype=bfloat16",
    "optimizer state": "use optimizer.name=sgd or es.master_dtype=bfloat16",
    "factors": "lower es.population or es.rank",
    "update factors": "lower es.population or es.rank",
    "gradient": "use more devices",
    "optimizer step": "use more devices or optimizer.name=sgd",
    "kv cache": "lower rollout.prompts_per_epoch, rollout.generations_per_prompt, rollout.max_new_tokens "
                "(rollout.max_episode_tokens with tools), the prompt length or es.population, or use more devices "
                "(mesh.model does not shrink it)",
    "activations": "lower rollout.prompts_per_epoch or es.population, or use more devices",
}


def plan_es(cfg: ModelConfig, *, population: int, rank: int, prompts: int, generations: int, prompt_tokens: int,
            max_new_tokens: int, devices: int, model_axis: int = 1, compute_dtype: str = "float32",
            master_dtype: str = "float32", optimizer: str = "sgd", momentum: bool = False,
            targets: tuple[str, ...] | None = None, device_memory: float | None = None,
            shard_min_size: int = SHARD_MIN_SIZE, cache_tokens: int | None = None,
            platform: str | None = None) -> MemoryPlan:
    """The per-device memory of one ES epoch; `cache_tokens` are the KV-cache slots after the prompt (default
    `max_new_tokens`; a multi-turn episode's: `RolloutConfig.cache_tokens`); `targets` are the perturbed paths
    (default: every matrix but the embedding and the LM head, as EGGROLL's defaults); leaves under
    `shard_min_size` elements keep replicated masters (mesh.shard_min_size); `platform`: the backend the run
    compiles for (`planned_platform`), whose optimizer step keeps its own scratch (`optimizer_step_arrays`)."""
    shapes = param_shapes(cfg)
    c, mb = itemsize(compute_dtype, "model.dtype"), itemsize(master_dtype, "es.master_dtype")
    m, pop = model_axis, devices // model_axis
    platform = planned_platform(platform)
    if targets is None:
        targets = tuple(p for p, s in shapes.items()
                        if len(s) == 2 and not (is_embedding(p) or is_lm_head(p)))
    compute = 0.0
    for path, shape in shapes.items():
        d_in, d_out = split_divisors(path, shape, m, cfg.head_dim) if len(shape) == 2 else (1, 1)
        compute += math.prod(shape) * c / (d_in * d_out)
    master_div = {p: master_divisors(p, s, pop, m, shard_min_size, cfg.head_dim) for p, s in shapes.items()}

    def sliced(path: str, itemsize: float) -> float:
        return math.prod(shapes[path]) * itemsize / math.prod(master_div[path])

    masters = sum(sliced(p, mb) for p in shapes)
    perturbed = sum(sliced(p, mb) for p in targets)
    copies = OPTIMIZER_COPIES.get(optimizer, 2) + (1 if optimizer == "sgd" and momentum else 0)
    pairs = population // 2
    pairs_per_device = max(math.ceil(pairs / pop), 1)
    factors = regenerate = 0.0
    for path in targets:
        i, o = shapes[path]
        d_in, d_out = split_divisors(path, shapes[path], m, cfg.head_dim)
        factors += pairs_per_device * rank * (i / d_in + o / d_out) * c
        # estimate_gradient: each device regenerates every pair's factors in fp32, but only the slice
        # its part of g needs along the sharded dimension (a draw and its scaled copy)
        g_in, g_out = master_div[path]
        regenerate += 2 * pairs * rank * (i / g_in + o / g_out) * 4
    gradient = sum(sliced(p, 4) for p in targets)
    rows = math.ceil(population * prompts * generations / pop)
    length = bucket_length(prompt_tokens) + (cache_tokens or max_new_tokens)
    terms = {"compute weights": compute, "master weights": masters, "optimizer state": copies * perturbed,
             "factors": factors,
             "kv cache": kv_cache_bytes(cfg, rows, length, c, m),
             "activations": prefill_activation_bytes(cfg, rows, bucket_length(prompt_tokens), c, m),
             "update factors": regenerate,
             "gradient": gradient,
             "optimizer step": optimizer_step_arrays(copies, platform) * gradient}
    phases = {"generation": ("kv cache", "activations"), "update": ("update factors", "gradient", "optimizer step")}
    return MemoryPlan(terms, devices, m, device_memory, population, phases, "es", f"pop={pop} model={m}",
                      dict(ES_ADVICE), platform)


def optimizer_step_arrays(copies: int, platform: str) -> float:
    """The scratch of the optimizer's step on the sharded masters, in g-sized arrays: with optimizer state, XLA:GPU
    materialises the update before adding it to the donated masters (SGD adds it in place); XLA:CPU also writes the
    new state apart, and keeps a fraction of g besides."""
    if platform == "cpu":
        return (copies + 1 if copies else 0) + 0.25
    return 1.0 if copies else 0.0


def plan_job(es_cfg: ESConfig, model_cfg: ModelConfig, *, devices: int, device_memory: float | None = None,
             prompt_tokens: int | None = None, population: int | None = None,
             platform: str | None = None) -> MemoryPlan:
    """`plan_es` for a `jaxcore es` job config (`ESConfig`); with tools, each row's cache holds a whole episode
    (`rollout.cache_tokens`)."""
    es, r, opt = es_cfg.es, es_cfg.rollout, es_cfg.optimizer
    return plan_es(model_cfg, population=population or es.population, rank=es.rank, prompts=r.prompts_per_epoch,
                   generations=r.generations_per_prompt, prompt_tokens=prompt_tokens_of(es_cfg, prompt_tokens),
                   max_new_tokens=r.completion_tokens, cache_tokens=r.cache_tokens, devices=devices,
                   model_axis=es_cfg.mesh.model,
                   compute_dtype=es_cfg.model.dtype, master_dtype=es.master_dtype, optimizer=opt.name,
                   momentum=bool(opt.momentum), device_memory=device_memory,
                   shard_min_size=es_cfg.mesh.shard_min_size, platform=platform)
