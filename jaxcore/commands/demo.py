"""The main job: EGGROLL on an embedded tiny model and task, no network needed.

Builds a tiny Llama-family checkpoint locally, warm-starts it with a short supervised run on
2-digit addition, converts it, trains it with EGGROLL sharded over 8 simulated CPU devices (or
the real accelerators), exports it to HF and scores it before/after with transformers.
Writes runs/demo/summary.json.

examples:
  jaxcore demo
  jaxcore demo --epochs 20 --population 64 --out runs/demo-small
"""

from __future__ import annotations

import argparse
import os
from typing import Annotated

from annotated_types import Ge

from jaxcore.config.schema import field_flag, flag_type

TRAIN, ROLLOUT = "jaxcore.runtime.config.TrainConfig", "jaxcore.runtime.config.RolloutConfig"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory")
    # Each number is checked against the range of the config field it sets (`jaxcore.config.schema`).
    parser.add_argument("--epochs", type=field_flag(TRAIN, "epochs"), default=150)
    parser.add_argument("--prompts-per-epoch", type=field_flag(ROLLOUT, "prompts_per_epoch"), default=128)
    parser.add_argument("--population", type=field_flag("jaxcore.es.config.EggrollConfig", "population"), default=128)
    parser.add_argument("--seed", type=field_flag(TRAIN, "seed"), default=0)
    parser.add_argument("--warm-steps", type=flag_type(Annotated[int, Ge(0)], "warm_steps"), default=250,
                        help="supervised warm-start steps")
    parser.add_argument("--devices", type=flag_type(Annotated[int, Ge(1)], "devices"), default=8,
                        help="simulated CPU devices when there is no accelerator")


def run(args: argparse.Namespace) -> int:
    import sys

    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}").strip()
    from jaxcore.demo.run import DemoConfig, run_demo

    run_demo(DemoConfig(out_dir=args.out, epochs=args.epochs, population=args.population, seed=args.seed,
                        warm_steps=args.warm_steps, prompts_per_epoch=args.prompts_per_epoch,
                        eval_every=max(1, min(25, args.epochs // 2))))
    return 0
