"""GRPO (group-relative policy optimisation) on the shared runtime, with TRL's formulas and metric names.

examples:
  jaxcore grpo --config configs/grpo_addition.yaml
  jaxcore grpo --config configs/grpo_addition.yaml grpo.beta=0.04 grpo.loss_type=grpo train.epochs=60
  jaxcore grpo --config configs/grpo_addition.yaml rollout.generations_per_prompt=16 grpo.num_iterations=2
  jaxcore grpo --config configs/grpo_addition.yaml --resume      # continue from the latest checkpoint

Every `key=value` after the options overrides the YAML (dotted keys; unknown keys are an error).
Sections: model, task, rollout (prompts_per_epoch = P, generations_per_prompt = G, max_new_tokens,
temperature/top_k/top_p/min_p), grpo (beta, epsilon, epsilon_high, loss_type, scale_rewards,
num_iterations, gradient_accumulation_steps, mask_truncated_completions, ref_model_path, fsdp),
optimizer (AdamW: learning_rate, weight_decay, schedule, warmup_steps, max_grad_norm), rewards, train,
distributed. The P x G completions are sharded over every visible device.
Outputs under train.out_dir: metrics.jsonl, tensorboard/, checkpoints/, reward.png, final_hf/.
"""

from __future__ import annotations

import argparse

from jaxcore.commands.es import add_arguments, run_config_job  # noqa: F401  (add_arguments: same options)


def run(args: argparse.Namespace) -> int:
    from jaxcore.api import GRPOTrainer

    return run_config_job(args, GRPOTrainer)


def train_grpo(cfg, resume: bool = False, allow_changes: bool = False) -> dict:
    """`GRPOTrainer(args=cfg).train(resume)`: load the model, run GRPO, export final_hf when configured."""
    from jaxcore.api import GRPOTrainer

    return GRPOTrainer(args=cfg).train(resume=resume, allow_changes=allow_changes)
