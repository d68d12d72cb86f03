"""EGGROLL evolution-strategies training on the shared runtime.

examples:
  jaxcore es --config configs/countdown.yaml
  jaxcore es --config configs/addition.yaml es.sigma=1e-3 train.epochs=20 model.path=./SmolLM2-135M
  jaxcore es --config configs/addition.yaml --resume          # continue from the latest checkpoint

Every `key=value` after the options overrides the YAML (dotted keys; unknown keys are an error).
The mesh is (pop, model): mesh.model=M shards each weight over M devices, the population gets the
rest; master weights and optimizer state are sharded over all devices (es.master_dtype). The run is
refused at start-up when `jaxcore plan` says it cannot fit the device memory.
Multi-host runs set distributed.coordinator.
Outputs under train.out_dir: metrics.jsonl, tensorboard/, checkpoints/, reward.png, final_hf/.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue from train.out_dir/checkpoints")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def run(args: argparse.Namespace) -> int:
    from jaxcore.train_config import ESConfig

    return run_config_job(args, ESConfig, train_es)


def run_config_job(args: argparse.Namespace, schema: type, train: Callable[..., dict]) -> int:
    """Load `schema` from --config plus overrides, train, and print the held-out reward change."""
    from jaxcore.config import load_config

    cfg = load_config(schema, args.config, args.overrides)
    summary = train(cfg, resume=args.resume)
    print(f"done: held-out reward {summary.get('eval_reward_before')} -> {summary.get('eval_reward_after')}"
          f" ({cfg.train.out_dir})")
    return 0


def train_es(cfg, resume: bool = False) -> dict:
    """Load the model, build the EGGROLL algorithm and run it; exports final_hf when configured."""
    from jaxcore.es_trainer import EggrollAlgorithm
    from jaxcore.train import run_training

    return run_training(cfg, lambda model, tokenizer, eos: EggrollAlgorithm(model, tokenizer, cfg, eos_token_ids=eos),
                        resume)
