"""Top ops by time in one EGGROLL population generation (or, to compare, plain batched inference or a
GRPO step), from a jax.profiler (perfetto) trace.

    python scripts/profile_es.py --preset bench --population 256 --new-tokens 16 --out runs/profile_es
    python scripts/profile_es.py --preset qwen2.5-0.5b --dtype bfloat16 --prompt-len 64 --new-tokens 64   # GPU
    python scripts/profile_es.py --what inference ...     # the same rows through the unperturbed model
    python scripts/profile_es.py --what grpo --preset qwen2.5-0.5b --dtype bfloat16   # one GRPO step (bench shape)

Set XLA_FLAGS=--xla_dump_to=DIR to map the fusion names printed here to their HLO.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

import numpy as np


def top_ops(trace_dir: Path, count: int) -> list[tuple[str, float, int]]:
    """(name, total ms, calls) of the `count` costliest XLA op events (not Python or executor frames)
    in the newest perfetto trace under trace_dir."""
    trace = max(trace_dir.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    events = json.loads(gzip.open(trace).read())
    events = events["traceEvents"] if isinstance(events, dict) else events
    total: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    for e in events:
        name = e.get("name", "")
        host = name.startswith(("$", "PjitFunction", "ParseArguments", "np.asarray", "PyArray")) or "::" in name
        if e.get("ph") == "X" and "dur" in e and not host:                         # XLA ops only
            total[e["name"]] += e["dur"] / 1e3
            calls[e["name"]] += 1
    return [(n, round(t, 2), calls[n]) for n, t in sorted(total.items(), key=lambda kv: -kv[1])[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", default="population", choices=["population", "inference", "grpo"])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on a GPU, float32 on CPU)")
    parser.add_argument("--population", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", default="runs/profile_es")
    args = parser.parse_args()

    import jax

    import jaxcore
    from jaxcore.bench import BenchOptions, bench_checkpoint
    from jaxcore.commands.bench import default_dtype
    from jaxcore.es import eggroll
    from jaxcore.inference.generate import generate

    args.dtype = args.dtype or default_dtype(jax.default_backend())

    model = jaxcore.load_hf(bench_checkpoint(BenchOptions(preset=args.preset, dtype=args.dtype)), dtype=args.dtype)
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (args.population, args.prompt_len))
    ids = ids.astype(np.int32)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=args.population, rank=1, sigma=1e-3))

    if args.what == "grpo":
        from jaxcore.bench.grpo import bench_config, jax_step, shapes, synthetic_batch
        from jaxcore.bench.roofline import model_shape

        opts = BenchOptions(preset=args.preset, dtype=args.dtype)
        rows, prompt_len, completion_len = shapes(opts, model_shape(model).total_params())
        batch = synthetic_batch(model.config.vocab_size, rows, prompt_len, completion_len)
        step = jax_step(model, batch, bench_config(completion_len))
    else:
        def step() -> None:
            gen_model = eggroll.population(model, plan, 0) if args.what == "population" else model
            jax.block_until_ready(generate(gen_model, ids, np.ones_like(ids), max_new_tokens=args.new_tokens,
                                           temperature=0.0))

    step()                                                   # compile outside the trace
    out = Path(args.out)
    with jax.profiler.trace(str(out), create_perfetto_trace=True):
        step()
    print(f"{'op':70s} {'ms':>10s} {'calls':>7s}")
    for name, ms, n in top_ops(out, args.top):
        print(f"{name[:70]:70s} {ms:10.2f} {n:7d}")


if __name__ == "__main__":
    main()
