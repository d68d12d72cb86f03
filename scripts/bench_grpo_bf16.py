"""Train the same GRPO rollouts with fp32 and bf16 compute and report how far the bf16 curves drift.

usage:
    python scripts/bench_grpo_bf16.py                       # bench model (~29M), 8 rollouts x mu=2
    python scripts/bench_grpo_bf16.py --preset tiny --steps 4 --json runs/bench/grpo_bf16.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxcore.bench import BenchOptions, bench_checkpoint
from jaxcore.bench.grpo import bf16_vs_fp32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--family", default="llama")
    parser.add_argument("--steps", type=int, default=8, help="rollouts (each trained num_iterations=2 times)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--workdir", default="runs/bench")
    parser.add_argument("--json", dest="json_path", help="write the curves and deviations here")
    args = parser.parse_args()
    path = bench_checkpoint(BenchOptions(preset=args.preset, family=args.family, workdir=args.workdir))
    result = bf16_vs_fp32(path, steps=args.steps, learning_rate=args.lr)
    for key in ("loss_max_dev", "nll_max_rel_dev", "nll_drop_fp32"):
        print(f"grpo.bf16.{key:20s} {result[key]:.4g}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
