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
import signal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue from train.out_dir/checkpoints")
    parser.add_argument("--resume-allow-changes", action="store_true",
                        help="with --resume: accept a checkpoint written with an incompatible config (logged)")
    parser.add_argument("--compilation-cache", metavar="DIR|off", default=None,
                        help="keep compiled programs in DIR for later runs, or off (sets train.compilation_cache; "
                             "default ~/.cache/jaxcore/xla; the environment variable JAXCORE_COMPILATION_CACHE "
                             "overrides both)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def run(args: argparse.Namespace) -> int:
    from jaxcore.api import ESTrainer

    return run_config_job(args, ESTrainer)


def run_config_job(args: argparse.Namespace, trainer_type: type) -> int:
    """Load the trainer's config from --config plus overrides, train, and print the held-out reward change."""
    from jaxcore.config.yaml_config import load_config

    cfg = load_config(trainer_type.config_type, args.config, args.overrides)
    if args.compilation_cache is not None:
        cfg.train.compilation_cache = args.compilation_cache
    summary = trainer_type(args=cfg).train(resume=args.resume, allow_changes=args.resume_allow_changes)
    if summary["stopped_by"]:
        if summary["checkpoint"] is None and cfg.train.checkpoint_every < 0:
            print(f"stopped by {summary['stopped_by']} after epoch {summary['last_epoch']}: no checkpoint kept "
                  "(train.checkpoint_every -1)")
        elif summary["checkpoint"] is None:
            print(f"stopped by {summary['stopped_by']} before the first epoch finished: no checkpoint; start the "
                  "run again")
        else:
            print(f"stopped by {summary['stopped_by']} after epoch {summary['last_epoch']}: checkpoint "
                  f"{summary['checkpoint']}; continue with --resume")
        return 128 + signal.Signals[summary["stopped_by"]].value      # 143 for SIGTERM, 130 for SIGINT
    first_step = summary.get("time_to_first_step")
    timing = "" if first_step is None else (f"; first step {first_step:.1f} s after start, "
                                            f"{summary['compile']['main_s']:.1f} s making programs")
    print(f"done: held-out reward {summary.get('eval_reward_before')} -> {summary.get('eval_reward_after')}"
          f" ({cfg.train.out_dir}{timing})")
    return 0
