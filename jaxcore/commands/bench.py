"""Benchmarks that report ratios against a reference measured side by side in the same run.

examples:
  jaxcore bench --suite all --json runs/bench.json
  jaxcore bench --suite generate --dtype bfloat16 --preset smollm2-135m      # on a GPU
  jaxcore bench --suite es --quick                                           # small shapes, fast

suites: generate (jaxcore vs HF generate), es (EGGROLL vs plain inference / naive ES, memory),
grpo (one optimisation step, torch vs jaxcore), rft (datagen throughput, jax engine vs HF).
"""

from __future__ import annotations

import argparse

SUITES = ("generate", "es", "grpo", "rft")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="all", help=f"all or a comma list of {', '.join(SUITES)}")
    parser.add_argument("--json", dest="json_path", help="write the results here")
    parser.add_argument("--preset", default="bench",
                        help="bench model preset: tiny, bench (CPU), smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, "
                             "llama3-8b (random weights), smollm2-135m-instruct (models/ if installed)")
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "gpt2"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument("--quick", action="store_true", help="tiny model and shapes (for tests)")
    parser.add_argument("--workdir", default="runs/bench", help="where bench models are written")


def run(args: argparse.Namespace) -> int:
    import importlib
    import json
    from pathlib import Path

    from jaxcore.bench import BenchOptions, device_info
    from jaxcore.errors import UserError

    suites = SUITES if args.suite == "all" else tuple(args.suite.split(","))
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise UserError(f"unknown suite(s) {', '.join(unknown)}; choose from all, {', '.join(SUITES)}")
    if args.dtype == "float32":
        import jax

        # Like torch's default (no TF32 in matmuls): fp32 means fp32 on both sides of every ratio.
        jax.config.update("jax_default_matmul_precision", "highest")
    options = BenchOptions(preset=args.preset, family=args.family, dtype=args.dtype, quick=args.quick,
                           workdir=args.workdir)
    results: dict = {"device": device_info(), "options": vars(options)}
    if any(s in suites for s in ("generate", "es", "grpo")):
        from jaxcore.bench.roofline import peaks_for

        results["peaks"] = peaks_for(options.dtype)      # measured once, shared by every suite's roofline
        print(f"{'peaks':36s} {results['peaks']}", flush=True)
    for suite in suites:
        print(f"== {suite}", flush=True)
        numbers = importlib.import_module(f"jaxcore.bench.{suite}").run(options)
        for key, value in numbers.items():
            print(f"{key:36s} {value}", flush=True)
        results.update(numbers)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0
