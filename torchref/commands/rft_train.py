"""LoRA SFT on rft-datagen output with peft and the HF Trainer (loss on the reasoning/answer tokens only).

Precision is automatic (bf16 where supported, fp16 on other GPUs, fp32 on the CPU; override with
--mixed-precision), TF32 is on for Ampere and newer, AdamW is fused on CUDA, the schedule is cosine
with warmup. Writes OUT/adapter (LoRA adapter), OUT/merged with --merge (a full HF directory that
`jaxcore convert --from-hf` reads) and OUT/train_log.json. Runs unchanged under torchrun or
accelerate launch: --batch-size is per device.

examples:
  torchref rft-train --model ./SmolLM2-360M-Instruct --data data/rft/rft.json --out runs/rft --merge
  torchrun --nproc_per_node 4 -m torchref.cli rft-train --model ./SmolLM2-360M-Instruct \\
      --data data/rft/rft.json --out runs/rft --batch-size 16 --grad-accum 2 --merge
  accelerate launch -m torchref.cli rft-train --model ./SmolLM2-360M-Instruct --data data/rft/rft.json --out runs/rft
"""

from __future__ import annotations

import argparse

from torchref.commands._common import add_prompt_arguments, prompt_options, show_progress
from torchref.rft.settings import Knob, add_knobs, resolve_knobs

KNOBS = (
    Knob("batch_size", "RFT_TRAIN_BATCH_SIZE", 16, "examples per device per step"),
    Knob("grad_accum", "RFT_GRAD_ACCUM", 1, "gradient accumulation steps"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="base HF model directory (config.json, safetensors, tokenizer)")
    parser.add_argument("--data", required=True, help="JSON list of [question, answer, reasoning] (rft-datagen output)")
    parser.add_argument("--out", required=True, help="output directory")
    add_knobs(parser, KNOBS)
    parser.add_argument("--epochs", type=float, default=3.0, help="default 3")
    parser.add_argument("--max-steps", type=int, default=-1, help="optimiser steps; > 0 overrides --epochs")
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="peak learning rate (default 2e-4)")
    parser.add_argument("--warmup", type=float, default=0.05,
                        help="linear warmup: a fraction < 1 of the steps, or a number of steps (default 0.05)")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="default 0")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (default 1.0)")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    parser.add_argument("--lora-alpha", type=int, default=32, help="LoRA alpha (default 32)")
    parser.add_argument("--lora-dropout", type=float, default=0.05, help="default 0.05")
    parser.add_argument("--target-modules", default=None,
                        help="comma-separated module names (default: q/k/v/o/gate/up/down_proj for Llama and Qwen, "
                             "c_attn,c_proj,c_fc for GPT-2)")
    parser.add_argument("--mixed-precision", choices=["auto", "no", "fp16", "bf16"], default="auto",
                        help="auto: bf16 where supported, fp16 on other GPUs, no (fp32) on the CPU")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                        help="recompute activations in the backward pass to save memory (default off)")
    parser.add_argument("--optim", default=None,
                        help="HF Trainer optimiser name (default adamw_torch_fused on CUDA, adamw_torch on the CPU)")
    parser.add_argument("--dataloader-workers", type=int, default=None,
                        help="DataLoader worker processes (default 4 on CUDA, 0 on the CPU); memory is pinned on CUDA")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per example, prompt included (default 512)")
    parser.add_argument("--save-strategy", choices=["no", "epoch", "steps"], default="epoch",
                        help="when to write Trainer checkpoints (default epoch)")
    parser.add_argument("--save-steps", type=int, default=500, help="with --save-strategy steps (default 500)")
    parser.add_argument("--save-total-limit", type=int, default=1, help="checkpoints kept (default 1)")
    parser.add_argument("--logging-steps", type=int, default=10, help="default 10")
    parser.add_argument("--report-to", default="none", help="tensorboard, wandb, ... (default none)")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint in OUT")
    parser.add_argument("--merge", action="store_true", help="also write OUT/merged: the LoRA weights merged in")
    parser.add_argument("--merge-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="dtype of the merged weights (auto: the base checkpoint's)")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_prompt_arguments(parser)


def end_distributed() -> None:
    """Tear down the process group that the Trainer (accelerate) set up under torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run(args: argparse.Namespace) -> int:
    show_progress(args.progress)
    from torchref.rft.train import TrainConfig, train

    targets = tuple(t.strip() for t in args.target_modules.split(",") if t.strip()) if args.target_modules else None
    config = TrainConfig(
        model=args.model, data=args.data, out=args.out, **resolve_knobs(args, KNOBS), epochs=args.epochs,
        max_steps=args.max_steps, learning_rate=args.learning_rate, warmup=args.warmup,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, lora_r=args.lora_r,
        lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=targets,
        mixed_precision=args.mixed_precision, gradient_checkpointing=args.gradient_checkpointing, optim=args.optim,
        dataloader_workers=args.dataloader_workers, max_length=args.max_length, save_strategy=args.save_strategy,
        save_steps=args.save_steps, save_total_limit=args.save_total_limit, logging_steps=args.logging_steps,
        report_to=args.report_to, resume=args.resume, merge=args.merge, merge_dtype=args.merge_dtype,
        seed=args.seed, progress=args.progress, **prompt_options(args))
    try:
        summary = train(config)
    finally:
        end_distributed()
    if not summary["main_process"]:
        return 0
    loss = (f", loss {summary['first_loss']:.4f} (step {summary['first_step']}) -> {summary['last_loss']:.4f} "
            f"(step {summary['last_step']})" if "first_loss" in summary else "")
    print(f"trained {summary['steps']} steps on {summary['examples']} examples ({summary['precision']}, "
          f"{summary['optim']}){loss}; adapter: {summary['adapter_dir']}"
          + (f"; merged: {summary['merged_dir']}" if "merged_dir" in summary else ""))
    return 0
