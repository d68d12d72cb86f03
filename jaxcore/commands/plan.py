"""Per-device memory of an ES run, from the config and the model's config.json (no weights loaded).

examples:
  jaxcore plan --config configs/countdown.yaml
  jaxcore plan --config es8b.yaml --devices 8 --device-memory 40GB --json plan.json
  jaxcore plan --config es8b.yaml --model-config tests/data/llama3.1-8b/config.json mesh.model=2

Prints compute weights, master weights, optimizer state, factors, KV cache and activations per
device, the total against --device-memory, and the largest population that fits.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="ES YAML config (see configs/)")
    parser.add_argument("--devices", type=int, default=None, help="devices (default: the visible ones)")
    parser.add_argument("--device-memory", default=None, help="per-device memory, e.g. 40GB (default: none)")
    parser.add_argument("--model-config", default=None, help="config.json (default: model.path/config.json)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="longest prompt in tokens")
    parser.add_argument("--json", default=None, help="also write the plan as JSON to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxcore.errors import UserError
    from jaxcore.job_config import ESConfig
    from jaxcore.memory_plan import largest_population, parse_bytes, plan_es_config
    from jaxcore.model_config import config_from_hf
    from jaxcore.yaml_config import load_config

    cfg = load_config(ESConfig, args.config, args.overrides)
    source = Path(args.model_config or Path(cfg.model.path) / "config.json")
    if not source.is_file():
        raise UserError(f"{source}: no config.json (pass --model-config)")
    model_cfg = config_from_hf(json.loads(source.read_text()))
    if args.devices is None:
        import jax

        args.devices = jax.device_count()
    memory = parse_bytes(args.device_memory) if args.device_memory else None
    if args.devices % cfg.mesh.model:
        raise UserError(f"mesh.model={cfg.mesh.model} does not divide {args.devices} devices")
    plan = plan_es_config(cfg, model_cfg, devices=args.devices, device_memory=memory, prompt_tokens=args.prompt_tokens)
    print(plan.table())
    best = None
    if memory is not None:
        pop = args.devices // cfg.mesh.model
        best = largest_population(lambda n: plan_es_config(cfg, model_cfg, devices=args.devices, device_memory=memory,
                                                           prompt_tokens=args.prompt_tokens, population=n).fits,
                                  cfg.es.population, pop)
        print(f"largest population that fits: {best}")
    if args.json:
        Path(args.json).write_text(json.dumps({"terms_bytes": plan.terms, "total_bytes": plan.total,
                                               "device_memory_bytes": memory, "fits": plan.fits,
                                               "devices": args.devices, "largest_population": best}, indent=2))
    return 0
