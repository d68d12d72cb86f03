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
from torchref.rft.train_config import SAVE_STRATEGIES, TrainConfig

T = TrainConfig          # every flag defaults to its setting there (declared once)
KNOBS = (
    Knob("batch_size", "RFT_TRAIN_BATCH_SIZE", T.batch_size, "examples per device per step"),
    Knob("grad_accum", "RFT_GRAD_ACCUM", T.grad_accum, "gradient accumulation steps"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="base HF model directory (config.json, safetensors, tokenizer)")
    parser.add_argument("--data", required=True, help="JSON list of [question, answer, reasoning] (rft-datagen output)")
    parser.add_argument("--out", required=True, help="output directory (an existing, non-empty one needs --resume or "
                                                    "--overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="write into an existing, non-empty --out")
    add_knobs(parser, KNOBS)
    parser.add_argument("--epochs", type=float, default=T.epochs, help=f"default {T.epochs:g}")
    parser.add_argument("--max-steps", type=int, default=T.max_steps, help="optimiser steps; > 0 overrides --epochs")
    parser.add_argument("--learning-rate", type=float, default=T.learning_rate,
                        help=f"peak learning rate (default {T.learning_rate:g})")
    parser.add_argument("--warmup", type=float, default=T.warmup,
                        help=f"linear warmup: a fraction < 1 of the steps, or a number of steps (default {T.warmup:g})")
    parser.add_argument("--weight-decay", type=float, default=T.weight_decay, help=f"default {T.weight_decay:g}")
    parser.add_argument("--max-grad-norm", type=float, default=T.max_grad_norm,
                        help=f"gradient clipping (default {T.max_grad_norm:g})")
    parser.add_argument("--lora-r", type=int, default=T.lora_r, help=f"LoRA rank (default {T.lora_r})")
    parser.add_argument("--lora-alpha", type=int, default=T.lora_alpha, help=f"LoRA alpha (default {T.lora_alpha})")
    parser.add_argument("--lora-dropout", type=float, default=T.lora_dropout, help=f"default {T.lora_dropout:g}")
    parser.add_argument("--target-modules", default=None,
                        help="comma-separated module names (default: q/k/v/o/gate/up/down_proj for Llama and Qwen, "
                             "c_attn,c_proj,c_fc for GPT-2)")
    parser.add_argument("--mixed-precision", choices=["auto", "no", "fp16", "bf16"], default=T.mixed_precision,
                        help="auto: bf16 where supported, fp16 on other GPUs, no (fp32) on the CPU")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                        default=T.gradient_checkpointing,
                        help="recompute activations in the backward pass to save memory (default off)")
    parser.add_argument("--optim", default=T.optim,
                        help="HF Trainer optimiser name (default adamw_torch_fused on CUDA, adamw_torch on the CPU)")
    parser.add_argument("--dataloader-workers", type=int, default=T.dataloader_workers,
                        help="DataLoader worker processes (default 4 on CUDA, 0 on the CPU); memory is pinned on CUDA")
    parser.add_argument("--max-length", type=int, default=T.max_length,
                        help=f"tokens per example, prompt included (default {T.max_length})")
    parser.add_argument("--save-strategy", choices=SAVE_STRATEGIES, default=T.save_strategy,
                        help=f"when to write Trainer checkpoints (default {T.save_strategy})")
    parser.add_argument("--save-steps", type=int, default=T.save_steps,
                        help=f"with --save-strategy steps (default {T.save_steps})")
    parser.add_argument("--save-total-limit", type=int, default=T.save_total_limit,
                        help=f"checkpoints kept (default {T.save_total_limit})")
    parser.add_argument("--logging-steps", type=int, default=T.logging_steps, help=f"default {T.logging_steps}")
    parser.add_argument("--report-to", default=T.report_to, help=f"tensorboard, wandb, ... (default {T.report_to})")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint in OUT")
    parser.add_argument("--merge", action="store_true", help="also write OUT/merged: the LoRA weights merged in")
    parser.add_argument("--merge-dtype", choices=["auto", "float32", "bfloat16", "float16"], default=T.merge_dtype,
                        help="dtype of the merged weights (auto: the base checkpoint's)")
    parser.add_argument("--seed", type=int, default=T.seed, help=f"default {T.seed}")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_prompt_arguments(parser)


def end_distributed() -> None:
    """Tear down the process group that the Trainer (accelerate) set up under torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run(args: argparse.Namespace) -> int:
    show_progress(args.progress)
    from jaxcore.outputs import check_output

    check_output(args.out, inputs=(args.model, args.data), overwrite=args.overwrite or args.resume, name="--out",
                 overwrite_hint="pass --resume to continue the run in it, or --overwrite")     # before the imports
    from torchref.rft.train import train  # lazy: torch, peft and transformers

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
