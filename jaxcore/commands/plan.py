"""Per-device memory of an ES or GRPO run, from the config and the model's config.json (no weights loaded).

examples:
  jaxcore plan --config configs/countdown.yaml
  jaxcore plan --config es8b.yaml --devices 8 --device-memory 40GB --json plan.json
  jaxcore plan --config es8b.yaml --model-config tests/data/llama3.1-8b/config.json mesh.model=2
  jaxcore plan --config configs/grpo_addition.yaml --devices 8 --device-memory 80GB grpo.fsdp=8
  jaxcore plan --config configs/grpo_addition.yaml --devices 8 --device-memory 80GB --platform gpu   # from a CPU host

A config with a `grpo` section (or grpo.* overrides) is planned as a GRPO run, else as ES. Prints
each term per device (compute weights, master weights, optimizer state, factors or gradients, KV
cache, activations), the peak against --device-memory and, when it does not fit, the same one line
`jaxcore es`/`grpo` refuse with (the biggest term and what to change); then the largest population
(ES) or prompts_per_epoch (GRPO) that fits.
"""

from __future__ import annotations

import argparse
import json
from typing import Annotated, Any

from annotated_types import Ge

from jaxcore.config.schema import field_flag, flag_type


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="ES or GRPO YAML config (see configs/)")
    parser.add_argument("--devices", type=flag_type(Annotated[int, Ge(1)], "devices"), default=None,
                        help="devices (default: the visible ones)")
    parser.add_argument("--device-memory", default=None, help="per-device memory, e.g. 40GB (default: none)")
    parser.add_argument("--model-config", default=None, help="config.json (default: model.path/config.json)")
    parser.add_argument("--prompt-tokens", type=field_flag("jaxcore.runtime.config.RolloutConfig", "max_prompt_length"),
                        default=None,
                        help="longest prompt in tokens (default: measured on the task's training prompts with "
                             "model.path's tokenizer, else rollout.max_prompt_length, else 128)")
    parser.add_argument("--platform", choices=("cpu", "gpu"), default=None,
                        help="the backend the run compiles for (default: JAX's default backend here): XLA:CPU and "
                             "XLA:GPU keep different buffers in GRPO's train step and ES's optimizer step")
    parser.add_argument("--json", default=None, help="also write the plan as JSON to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --json file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def trainer_type(path: str | None, overrides: list[str]) -> type:
    """GRPOTrainer when the YAML has a `grpo` section or an override sets grpo.*, else ESTrainer (each
    names its config and its algorithm)."""
    from jaxcore.api import ESTrainer, GRPOTrainer
    from jaxcore.config.yaml_config import read_yaml

    keys = set(read_yaml(path)) if path else set()
    keys |= {o.split("=", 1)[0].split(".", 1)[0] for o in overrides}
    return GRPOTrainer if "grpo" in keys else ESTrainer


def task_prompt_tokens(cfg: Any) -> int | None:
    """The longest of the config's training prompts in tokens, as the run's check measures it (`plan_check.
    measured_prompt_tokens`: chat template, system prompt, tools); None without a tokenizer at model.path."""
    from jaxcore.agents import build_agent
    from jaxcore.hf.tokenization import tokenizer_if_present
    from jaxcore.runtime.plan_check import measured_prompt_tokens
    from jaxcore.runtime.rollout import Rollout
    from jaxcore.runtime.training import make_task

    agent = build_agent(cfg.rollout, cfg.rewards)
    try:
        task = make_task(cfg.task, cfg.rewards.functions, cfg.rewards.weights, cfg.rewards.timeout_s,
                         scored_by_environment=bool(agent is not None and agent.reward_names),
                         chat_template_kwargs=cfg.rollout.chat_template_kwargs)
        tokenizer = tokenizer_if_present(cfg.model.path or None, cfg.rollout.chat_template_kwargs)
        return None if tokenizer is None else measured_prompt_tokens(cfg, task, Rollout(cfg.rollout, tokenizer,
                                                                                          agent=agent))
    finally:
        if agent is not None:
            agent.close()


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxcore.config.yaml_config import load_config
    from jaxcore.errors import UserError
    from jaxcore.hf.convert import read_json_config
    from jaxcore.model.families import config_from_hf
    from jaxcore.outputs import check_output, write_text
    from jaxcore.runtime.memory import refusal
    from jaxcore.runtime.plan_check import hf_config_at, parse_bytes, prompt_tokens_of

    json_inputs = (args.config, args.model_config)
    if args.json:                                             # refused before any work: never over an input
        check_output(args.json, kind="file", inputs=json_inputs, overwrite=args.overwrite, name="--json")
    trainer = trainer_type(args.config, args.overrides)
    cfg = load_config(trainer.config_type, args.config, args.overrides)
    algorithm = trainer.algorithm_type(cfg)
    if args.model_config:
        source = Path(args.model_config)
        hf = read_json_config(source) if source.is_file() else None
    else:
        source = Path(cfg.model.path) / "config.json"
        hf = hf_config_at(cfg.model.path)
    if hf is None:
        raise UserError(f"{source}: no config.json (pass --model-config)")
    model_cfg = config_from_hf(hf)
    if args.devices is None:
        import jax

        args.devices = jax.device_count()
    memory = parse_bytes(args.device_memory) if args.device_memory else None
    name, size = algorithm.mesh_divisor(cfg)
    if size < 1 or args.devices % size:
        raise UserError(f"{name}={size} does not divide {args.devices} devices")
    prompt_tokens = args.prompt_tokens or (None if args.model_config else task_prompt_tokens(cfg))
    common = dict(devices=args.devices, device_memory=memory, prompt_tokens=prompt_tokens, platform=args.platform)
    plan = algorithm.memory_plan(cfg, model_cfg, **common)
    print(plan.table())
    planned_prompt = prompt_tokens_of(cfg, prompt_tokens)
    print(f"{'prompt tokens':<24}{planned_prompt:10d}   (" + ("--prompt-tokens" if args.prompt_tokens else
          "the longest training prompt" if prompt_tokens else "rollout.max_prompt_length or the default") + ")")
    reason = refusal(plan)
    if reason:
        print(reason)
    layout = algorithm.layout_refusal(cfg, args.devices)
    if layout:
        print(f"refused on {args.devices} devices: {layout}")
    out = {**plan.to_json(), "prompt_tokens": planned_prompt, **({"refused": layout} if layout else {})}
    largest = algorithm.largest_fitting(cfg, model_cfg, **common) if memory is not None else None
    if largest is not None:
        setting, best = largest
        print(f"largest {setting} that fits: {best}")
        out[f"largest_{setting.rpartition('.')[2]}"] = best           # largest_population, largest_prompts_per_epoch
    if args.json:
        write_text(args.json, json.dumps(out, indent=2), inputs=json_inputs, overwrite=args.overwrite, name="--json")
    return 0
