"""Issue 11 item 7 (needs a GPU): ES population generation at Llama-3.1-8B's shape, random bf16 weights.

    python scripts/bench_es_8b.py [--config tests/data/llama3.1-8b/config.json] [--population 64]
        [--prompts 16] [--new-tokens 256] [--prompt-tokens 128]

Prints tokens/s of the population vs plain generation of the same rows, first-call compile time,
the device's peak memory and the memory planner's figure (bf16 masters, one device).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore import eggroll
from jaxcore.generate import generate
from jaxcore.memory_plan import plan_es
from jaxcore.model import create_model
from jaxcore.model_config import config_from_hf


def timed(fn):
    start = time.perf_counter()
    out = fn()
    jax.block_until_ready(out.tokens)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="tests/data/llama3.1-8b/config.json")
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    cfg = config_from_hf(json.loads(Path(args.config).read_text()))
    model = create_model(cfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=args.population, rank=1))
    rows = args.population * args.prompts
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, args.prompt_tokens))
    mask = np.ones_like(ids)
    kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, key=jax.random.key(0))
    population = eggroll.population(model, plan, 0)
    _, first = timed(lambda: generate(population, ids, mask, **kw))
    out, pop_s = timed(lambda: generate(population, ids, mask, **kw))
    _, plain_first = timed(lambda: generate(model, ids, mask, **kw))
    plain, plain_s = timed(lambda: generate(model, ids, mask, **kw))
    stats = jax.local_devices()[0].memory_stats() or {}
    planned = plan_es(cfg, population=args.population, rank=1, prompts=args.prompts, generations=1,
                      prompt_tokens=args.prompt_tokens, max_new_tokens=args.new_tokens, devices=1,
                      compute_dtype="bfloat16", master_dtype="bfloat16")
    tokens = int(np.asarray(out.lengths).sum())
    print(json.dumps({
        "device": str(jax.devices()[0]), "rows": rows,
        "population_tokens_per_s": tokens / pop_s, "plain_tokens_per_s": int(np.asarray(plain.lengths).sum()) / plain_s,
        "population_compile_s": first - pop_s, "plain_compile_s": plain_first - plain_s,
        "peak_bytes": stats.get("peak_bytes_in_use"), "planned_bytes": planned.total,
        "planned_terms": planned.terms}, indent=2))


if __name__ == "__main__":
    main()
