"""Issue 11 item 7 (needs a GPU): one ES epoch at Llama-3.1-8B's shape on one device, random weights.

    python scripts/bench_es_8b.py [--config tests/data/llama3.1-8b/config.json] [--population 64]
        [--prompts 16] [--new-tokens 256] [--prompt-tokens 128] [--master-dtype bfloat16] [--device-memory 80GB]

Does what `jaxcore es` does in an epoch, with its own functions: master weights (es.master_dtype), the
bf16 compute copy re-assembled from them (`compute_model`), the population's generation, then the ES
update (`es_step`, SGD). Prints tokens/s of the population vs plain generation of the same rows,
first-call compile times, the device's peak memory, and the memory planner's per-device total for
exactly this run (`jaxcore.es.memory.plan_es`, one device: the same figure `jaxcore plan` prints).

The issue's setting (population 64, 16 prompts, 256 new tokens, bf16 masters) does not fit one 80 GB
H100 per the planner: 102.6 GB at the peak (16.1 GB compute weights + 16.1 GB bf16 masters + the
generation phase: KV cache 51.5 GB and prefill activations 18.8 GB). The script then prints that plan
and the refusal line, and runs the nearest setting that fits: the same population, tokens and masters
with the largest prompt count that fits (10 prompts, 76.2 GB, for 80 GB). Device memory is the
GPU's own limit (XLA_PYTHON_CLIENT_MEM_FRACTION is raised to 0.95 here), else --device-memory.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")     # before jax starts: 95% of the GPU

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxcore.es import eggroll  # noqa: E402
from jaxcore.es.algorithm import compute_model  # noqa: E402
from jaxcore.es.memory import plan_es
from jaxcore.inference.generate import generate  # noqa: E402
from jaxcore.model.families import config_from_hf  # noqa: E402
from jaxcore.model.transformer import create_model  # noqa: E402
from jaxcore.parallel import meshes
from jaxcore.runtime.memory import GB, refusal  # noqa: E402
from jaxcore.runtime.optim import OptimizerConfig, make_optimizer  # noqa: E402
from jaxcore.runtime.plan_check import accelerator_memory, parse_bytes  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return out, time.perf_counter() - start


def make_plan(cfg, args, prompts: int, memory: float):
    return plan_es(cfg, population=args.population, rank=args.rank, prompts=prompts, generations=1,
                   prompt_tokens=args.prompt_tokens, max_new_tokens=args.new_tokens, devices=1,
                   compute_dtype="bfloat16", master_dtype=args.master_dtype, optimizer="sgd", device_memory=memory)


def fitting_plan(cfg, args, memory: float):
    """The plan for --prompts, or (printed, with the refusal line) the largest prompt count that fits."""
    plan = make_plan(cfg, args, args.prompts, memory)
    print(plan.table())
    if plan.fits:
        return plan, args.prompts
    print("the plan says:", refusal(plan))
    for prompts in range(args.prompts - 1, 0, -1):
        smaller = make_plan(cfg, args, prompts, memory)
        if smaller.fits:
            print(f"running the nearest setting that fits: {prompts} prompts (population {args.population}, "
                  f"{args.new_tokens} new tokens, {args.master_dtype} masters), {smaller.total / GB:.1f} GB planned")
            return smaller, prompts
    raise SystemExit("no prompt count fits; lower --population or --new-tokens")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="tests/data/llama3.1-8b/config.json")
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--master-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--device-memory", default=None, help="default: the GPU's limit, else 80GB")
    args = parser.parse_args()
    cfg = config_from_hf(json.loads(Path(args.config).read_text()))
    memory = parse_bytes(args.device_memory) if args.device_memory else (accelerator_memory() or 80e9)
    planned, prompts = fitting_plan(cfg, args, memory)

    mesh = meshes.es_mesh(1, jax.devices()[:1])
    rows_sharding = meshes.leading_axis(mesh, meshes.POP)
    masters = create_model(cfg, dtype=jnp.bfloat16, param_dtype=jnp.dtype(args.master_dtype))
    plan = eggroll.make_plan(masters, eggroll.EggrollConfig(population=args.population, rank=args.rank))
    compute = compute_model(masters, mesh)                    # the bf16 copy the rollouts use, as in the trainer
    rows = args.population * prompts
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, args.prompt_tokens))
    mask = np.ones_like(ids)
    kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, key=jax.random.key(0), row_sharding=rows_sharding)
    population = eggroll.population(compute, plan, 0, out_sharding=rows_sharding)
    _, first = timed(lambda: generate(population, ids, mask, **kw))
    out, pop_s = timed(lambda: generate(population, ids, mask, **kw))
    _, plain_first = timed(lambda: generate(compute, ids, mask, **kw))
    plain, plain_s = timed(lambda: generate(compute, ids, mask, **kw))
    fitness = np.asarray(out.logprobs).sum(1).reshape(args.population, -1).mean(1)
    optimizer = make_optimizer(OptimizerConfig("sgd"), learning_rate=1e-3)
    opt_state = optimizer.init(eggroll.perturbed_params(masters, plan))
    update_s = []
    for epoch in range(2):                                    # the first includes compilation
        start = time.perf_counter()
        opt_state, _ = eggroll.es_step(masters, plan, optimizer, opt_state, epoch, fitness, donate_params=True)
        jax.block_until_ready(eggroll.perturbed_params(masters, plan))
        update_s.append(time.perf_counter() - start)
    stats = jax.local_devices()[0].memory_stats() or {}
    tokens = int(np.asarray(out.lengths).sum())
    print(json.dumps({
        "device": str(jax.devices()[0]), "population": args.population, "prompts": prompts, "rows": rows,
        "new_tokens": args.new_tokens, "master_dtype": args.master_dtype,
        "population_tokens_per_s": tokens / pop_s, "plain_tokens_per_s": int(np.asarray(plain.lengths).sum()) / plain_s,
        "population_compile_s": first - pop_s, "plain_compile_s": plain_first - plain_s,
        "update_s": update_s[1], "update_compile_s": update_s[0] - update_s[1],
        "peak_bytes": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
        "planned_bytes": planned.total, "planned_terms": planned.terms, "planned_phases": planned.phase_totals(),
        "planned_persistent": planned.persistent}, indent=2))


if __name__ == "__main__":
    main()
