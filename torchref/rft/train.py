"""LoRA SFT on RFT data with peft and the HF Trainer.

Precision is picked per device (`precision.mixed_precision`): bf16 where supported, fp16 on other
GPUs, fp32 on the CPU; TF32 on Ampere and newer; fused AdamW on CUDA. The base weights stay fp32
(autocast does the low-precision compute). Nothing here places tensors on a device: the Trainer
does, so the same code runs on one CPU, one GPU, or several under `torchrun` / `accelerate launch`.

Output directory: `checkpoint-*/` (Trainer checkpoints, at most `save_total_limit`), `adapter/`
(the final LoRA adapter + tokenizer), `merged/` (with `merge`: a full HF model directory that
`jaxcore convert --from-hf` reads) and `train_log.json` (config, loss history, summary).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jaxcore.hf.convert import CheckpointError, read_hf_config
from jaxcore.hf.tokenization import load_tokenizer
from jaxcore.outputs import write_text
from torchref.rft.data import load_sft
from torchref.rft.engines import existing_dir
from torchref.rft.lora import lora_targets, merge_to_hf, wrap_lora
from torchref.rft.precision import default_optim, mixed_precision, tf32_capable
from torchref.rft.prompts import resolve_format
from torchref.rft.sft_data import PadCollator, SFTDataset
from torchref.rft.train_config import SAVE_STRATEGIES, TrainConfig  # noqa: F401  (re-exported)


def build_lora_model(cfg: TrainConfig, model_type: str) -> Any:
    """The fp32 base model (on the CPU; the Trainer moves it) wrapped with LoRA adapters."""
    from torchref.model import load_reference

    try:
        model = load_reference(cfg.model)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{cfg.model}: cannot load the model ({str(err).splitlines()[0]})") from err
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return wrap_lora(model, model_type, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                     targets=cfg.target_modules)


def training_arguments(cfg: TrainConfig, precision: str) -> Any:
    """TrainingArguments for `cfg` on this device."""
    import torch
    from transformers import TrainingArguments

    cuda = torch.cuda.is_available()
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    warmup = ({"warmup_ratio": cfg.warmup} if cfg.warmup < 1 and "warmup_ratio" in fields
              else {"warmup_steps": cfg.warmup if cfg.warmup < 1 else int(cfg.warmup)})
    workers = cfg.dataloader_workers if cfg.dataloader_workers is not None else (4 if cuda else 0)
    return TrainingArguments(
        output_dir=cfg.out, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate, lr_scheduler_type="cosine", weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, optim=cfg.optim or default_optim(),
        bf16=precision == "bf16", fp16=precision == "fp16", tf32=True if tf32_capable() else None,
        dataloader_num_workers=workers, dataloader_pin_memory=cuda, dataloader_persistent_workers=workers > 0,
        save_strategy=cfg.save_strategy, save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps, logging_first_step=True, report_to=cfg.report_to, seed=cfg.seed,
        remove_unused_columns=False, ddp_find_unused_parameters=False, disable_tqdm=not cfg.progress,
        use_cpu=not cuda and not torch.backends.mps.is_available(),   # CPU processes under torchrun: gloo DDP
        **warmup)


def loss_summary(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last logged training loss."""
    losses = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    if not losses:
        return {}
    return {"first_step": losses[0][0], "first_loss": losses[0][1], "last_step": losses[-1][0],
            "last_loss": losses[-1][1]}


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run LoRA SFT; returns the summary also written to `out/train_log.json` (by the main process)."""
    from transformers import Trainer, set_seed

    tokenizer = load_tokenizer(existing_dir(cfg.model))
    model_type = read_hf_config(cfg.model).get("model_type", "")
    fmt = resolve_format(tokenizer, template=cfg.template, chat=cfg.chat, system=cfg.system)
    dataset = SFTDataset(load_sft(cfg.data), tokenizer, fmt, cfg.max_length)
    precision = mixed_precision(cfg.mixed_precision)
    set_seed(cfg.seed)
    model = build_lora_model(cfg, model_type)
    args = training_arguments(cfg, precision)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                      data_collator=PadCollator(tokenizer.pad_token_id))
    resume = cfg.resume and any(Path(cfg.out).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    out = Path(cfg.out)
    trainer.save_model(str(out / "adapter"))
    summary: dict[str, Any] = {
        "examples": len(dataset), "dropped_too_long": dataset.dropped, "steps": trainer.state.global_step,
        "world_size": args.world_size, "precision": precision, "optim": cfg.optim or default_optim(),
        "chat_template": fmt.chat,
        "lora_targets": lora_targets(model_type, cfg.target_modules),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "adapter_dir": str(out / "adapter"), "main_process": trainer.is_world_process_zero(),
        **loss_summary(trainer.state.log_history)}
    if summary["main_process"]:
        if cfg.merge:
            summary["merged_dir"] = str(merge_to_hf(trainer.model, cfg.model, out / "merged", cfg.merge_dtype))
        record = {"config": dataclasses.asdict(cfg), "summary": summary, "log_history": trainer.state.log_history}
        write_text(out / "train_log.json", json.dumps(record, indent=2, default=str) + "\n", overwrite=True,
                   name="--out's train_log.json")            # whole or not at all, never through a pipe or device
    return summary
