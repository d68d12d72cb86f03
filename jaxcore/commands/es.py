"""EGGROLL evolution-strategies training on the shared runtime.

examples:
  jaxcore es --config configs/countdown.yaml
  jaxcore es --config configs/addition.yaml es.sigma=1e-3 train.epochs=20 model.path=./SmolLM2-135M
  jaxcore es --config configs/addition.yaml --resume          # continue from the latest checkpoint

Every `key=value` after the options overrides the YAML (dotted keys; unknown keys are an error).
The population is sharded over every visible device; multi-host runs set distributed.coordinator.
Outputs under train.out_dir: metrics.jsonl, tensorboard/, checkpoints/, reward.png, final_hf/.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue from train.out_dir/checkpoints")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def run(args: argparse.Namespace) -> int:
    from jaxcore.config import load_config
    from jaxcore.train_config import ESConfig

    cfg = load_config(ESConfig, args.config, args.overrides)
    summary = train_es(cfg, resume=args.resume)
    print(f"done: held-out reward {summary.get('eval_reward_before')} -> {summary.get('eval_reward_after')}"
          f" ({cfg.train.out_dir})")
    return 0


def train_es(cfg, resume: bool = False) -> dict:
    """Load the model, build the EGGROLL algorithm and run it; exports final_hf when configured."""
    from pathlib import Path

    import jax

    from jaxcore.cli import UserError
    from jaxcore.convert import save_hf
    from jaxcore.es_trainer import EggrollAlgorithm
    from jaxcore.model_checkpoint import load_any
    from jaxcore.sharding import maybe_initialize_distributed
    from jaxcore.tokenization import eos_token_ids, load_tokenizer
    from jaxcore.train import Runner, make_task

    d = cfg.distributed
    if d.coordinator:
        maybe_initialize_distributed(d.coordinator, d.num_processes, d.process_id)
    task = make_task(cfg.task)
    if not cfg.model.path:
        raise UserError("model.path is not set (an HF directory or a jaxcore checkpoint)")
    model, tok_dir = load_any(cfg.model.path, cfg.model.dtype, remat=cfg.model.remat)
    if tok_dir is None:
        raise UserError(f"{cfg.model.path}: no tokenizer files")
    tokenizer = load_tokenizer(tok_dir)
    eos = eos_token_ids(tokenizer, model.config.hf_config)
    try:
        algorithm = EggrollAlgorithm(model, tokenizer, cfg, eos_token_ids=eos)
    except ValueError as err:
        raise UserError(str(err)) from err
    summary = Runner(cfg, algorithm, tokenizer, task, eos_token_ids=eos).run(resume=resume)
    if cfg.train.export_hf and summary["stopped_by"] is None and jax.process_index() == 0:
        summary["final_hf"] = str(save_hf(model, Path(cfg.train.out_dir) / "final_hf", tokenizer_dir=tok_dir))
    return summary
