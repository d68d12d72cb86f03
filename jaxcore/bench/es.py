"""EGGROLL throughput and memory against references measured in the same run.

es.eggroll_over_inference: tokens/s of population generation (one sequence per member) over plain
    batched generation of the same number of sequences with the unperturbed model.
es.eggroll_over_naive: naive full-rank ES, which materialises W + sigma * E for each member and
    generates member after member (as torch code that clones and restores weights does), over
    EGGROLL. The naive time is measured on `naive_members` members and scaled to the population.
es.memory_over_inference: peak memory XLA plans for the population's prefill and decode over plain
    inference at the same batch.
es.eggroll_over_naive_bound: the hardware's bound on es.eggroll_over_naive, batched-over-batch-1
    inference: population * (time of one plain batch-1 generate) / (time of the plain batched generate).
    EGGROLL is at best as fast as plain batched inference and each naive member costs at least one
    batch-1 generate, so the ratio cannot exceed this by more than the naive side's materialisation
    share (es.naive_materialise_share, measured too).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from jaxcore.bench import (
    REAL_SHAPES,
    BenchOptions,
    bench_checkpoint,
    compiled_bytes,
    interleaved_best_times,
    is_real_size,
    model_summary,
    roofline_entry,
)
from jaxcore.bench.roofline import peaks_for


def shapes(options: BenchOptions) -> dict[str, int]:
    if is_real_size(options):
        return {"population": REAL_SHAPES["batch"], "prompt_len": REAL_SHAPES["prompt_len"],
                "new_tokens": REAL_SHAPES["new_tokens"], "naive_members": 2, "rank": 1}
    if options.quick:
        return {"population": 16, "prompt_len": 16, "new_tokens": 16, "naive_members": 2, "rank": 1}
    return {"population": 256, "prompt_len": 16, "new_tokens": 64, "naive_members": 4, "rank": 1}


def generate_bytes(model: Any, ids: np.ndarray, new_tokens: int) -> dict[str, int]:
    """Bytes XLA plans for generate()'s prefill and decode programs with this model and batch."""
    import jax
    import jax.numpy as jnp

    from jaxcore.inference import generate as gen
    from jaxcore.inference.sampling import SamplingConfig

    length = gen.bucket_length(ids.shape[1])
    ids_j = jnp.zeros((ids.shape[0], length), jnp.int32)
    prefill = compiled_bytes(gen.prefill, model, ids_j, ids_j, cache_length=length + new_tokens)
    logits, cache = jax.eval_shape(functools.partial(gen.prefill, cache_length=length + new_tokens), model, ids_j,
                                   ids_j)
    decode = compiled_bytes(gen.decode, model, cache, logits, jnp.zeros(ids.shape[0], jnp.int32),
                            jnp.int32(length), jax.random.key(0), max_new_tokens=new_tokens,
                            sampling=SamplingConfig(temperature=0.0), eos_ids=(), pad_id=0)
    cache_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(cache))
    return {"prefill": prefill, "decode": decode, "peak": max(prefill, decode), "cache": cache_bytes}


@functools.cache
def _perturbed_weight() -> Any:
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.jit, static_argnames="sigma")
    def perturbed(w: jax.Array, key: jax.Array, index: jax.Array, sigma: float) -> jax.Array:
        noise = jax.random.normal(jax.random.fold_in(key, index), w.shape, jnp.float32)
        return w + (sigma * noise).astype(w.dtype)

    return perturbed


def naive_perturbed(base: dict[str, Any], key: Any, sigma: float) -> dict[str, Any]:
    """Naive full-rank ES's member weights: W + sigma * E for every weight, E drawn for that weight alone.

    One small program per distinct weight shape, reused at every layer, so compile time does not grow with
    depth: a single program drawing every weight (or one draw per weight in one program) takes XLA longer to
    compile at real depths than the whole measurement (docs/benchmarks.md).
    """
    import jax.numpy as jnp

    perturbed = _perturbed_weight()
    return {path: perturbed(w, key, jnp.int32(i), sigma) for i, (path, w) in enumerate(base.items())}


def run(options: BenchOptions) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import jaxcore
    from jaxcore.es import eggroll
    from jaxcore.inference.generate import generate
    from jaxcore.model.state import flat_state, variable_at

    s = shapes(options)
    model = jaxcore.load_hf(bench_checkpoint(options), dtype=options.dtype)
    n = s["population"]
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (n, s["prompt_len"])).astype(np.int32)
    mask = np.ones_like(ids)
    cfg = eggroll.EggrollConfig(population=n, rank=s["rank"], sigma=1e-3)
    plan = eggroll.make_plan(model, cfg)
    gen = functools.partial(generate, max_new_tokens=s["new_tokens"], temperature=0.0)

    def population_generate():
        pop = eggroll.population(model, plan, 0)      # factors made once per epoch, inside the timing
        return jax.block_until_ready(gen(pop, ids, mask))

    def plain_generate():
        return jax.block_until_ready(gen(model, ids, mask))

    def batch1_generate():                            # one plain batch-1 generate: the bound's denominator side
        return jax.block_until_ready(gen(model, ids[:1], mask[:1]))

    # alternated round by round, so that load from other processes on a shared machine hits every side alike
    times = interleaved_best_times({"population": population_generate, "plain": plain_generate,
                                    "batch1": batch1_generate}, rounds=2)
    pop_s, plain_s, batch1_s = times["population"], times["plain"], times["batch1"]

    base = {t.path: variable_at(model, t.path).get_value() for t in plan.targets}

    def naive_member(i: int) -> None:
        for path, value in naive_perturbed(base, jax.random.key(i), cfg.sigma).items():
            variable_at(model, path).set_value(value)
        jax.block_until_ready(gen(model, ids[i:i + 1], mask[i:i + 1]))

    naive_member(0)                                   # compile
    start = time.perf_counter()
    for i in range(s["naive_members"]):
        naive_member(i)
    naive_s = (time.perf_counter() - start) / s["naive_members"] * n
    for path, value in base.items():
        variable_at(model, path).set_value(value)
    # the hardware's bound on eggroll_over_naive: batched over batch-1 plain inference
    naive_bound = n * batch1_s / plain_s
    peaks_for(options.dtype, options.quick, refresh=True)      # re-measured next to the timings (max kept)

    pop_bytes = generate_bytes(eggroll.population(model, plan, 0), ids, s["new_tokens"])
    plain_bytes = generate_bytes(model, ids, s["new_tokens"])
    noise_bytes = sum(x.nbytes for x in jax.tree.leaves(eggroll.member_noise(plan, jnp.int32(0))))
    params = sum(int(v.size) for v in flat_state(model).values())
    targets = [(t.shape[-2], t.shape[-1]) for t in plan.targets if t.low_rank
               for _ in range(int(np.prod(t.shape[:-2])))]        # stacked layers: one factor pair each
    gen_shape = dict(batch=n, prompt_len=s["prompt_len"], new_tokens=s["new_tokens"])
    roofline = {"es.population_roofline": roofline_entry(model, options, pop_s, factor_targets=targets,
                                                         rank=s["rank"], **gen_shape),
                "es.inference_roofline": roofline_entry(model, options, plain_s, **gen_shape),
                "es.naive_member_roofline": roofline_entry(model, options, naive_s / n, batch=1,
                                                           prompt_len=s["prompt_len"], new_tokens=s["new_tokens"])}
    return {"es.eggroll_over_inference": round(plain_s / pop_s, 3),
            "es.eggroll_over_naive": round(naive_s / pop_s, 1),
            "es.eggroll_over_naive_bound": round(naive_bound, 1),
            "es.naive_materialise_share": round(max(0.0, 1 - batch1_s * n / naive_s), 3),
            "es.batch1_generate_s": batch1_s,
            "es.memory_over_inference": round(pop_bytes["peak"] / plain_bytes["peak"], 3),
            "es.population_tokens_per_s": round(n * s["new_tokens"] / pop_s, 1),
            "es.inference_tokens_per_s": round(n * s["new_tokens"] / plain_s, 1),
            "es.naive_seconds_per_member": round(naive_s / n, 3),
            "es.population_bytes": pop_bytes, "es.inference_bytes": plain_bytes, "es.noise_bytes": noise_bytes,
            **roofline,
            "es.shape": {**s, **model_summary(model), "params": params}}
