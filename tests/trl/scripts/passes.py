"""A TRL run over 12 prompts, 4 per generation, for two passes (num_train_epochs=2), shuffled and in the dataset's
order: the prompts each generation's reward call sees, the trainer_state it gets, the metric it logs with log_metric,
and the precision the run trains in (resolved bf16; the compute precision; the saved weights' dtype)."""
import json
import sys
from pathlib import Path

from datasets import Dataset
from safetensors import safe_open
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Write about the number {i}."} for i in range(12)])


def run(shuffle: bool) -> dict:
    calls = []

    def reward_len(prompts, completions, trainer_state, log_metric, **kwargs):
        if len(prompts) == 8:                           # a generation's rows (not jaxcore's probe of two)
            calls.append({"prompts": sorted(set(prompts)), "global_step": trainer_state.global_step,
                          "epoch": round(trainer_state.epoch or 0.0, 6), "max_steps": trainer_state.max_steps})
            log_metric("prompt_number", sum(int(p.split()[-1].rstrip(".")) for p in prompts) / len(prompts))
        return [-abs(20 - len(completion)) for completion in completions]

    out = Path(sys.argv[2]) / ("shuffled" if shuffle else "ordered")
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=2, max_completion_length=4,
                      num_train_epochs=2, shuffle_dataset=shuffle, report_to="none", save_strategy="no",
                      logging_steps=1, use_cpu=True)
    trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=args, train_dataset=dataset)
    trainer.train()
    trainer.save_model()
    with safe_open(str(out / "model.safetensors"), "np") as saved:
        weights = str(saved.get_tensor(next(iter(saved.keys()))).dtype)
    accelerator = getattr(trainer, "accelerator", None)     # TRL: accelerate's mixed precision; jaxcore: the job's
    compute = accelerator.mixed_precision if accelerator is not None else trainer.job_trainer.args.model.dtype
    logged = [entry["prompt_number"] for entry in trainer.state.log_history if "prompt_number" in entry]
    return {"global_step": trainer.state.global_step, "calls": calls, "bf16": args.bf16, "compute": compute,
            "weights": weights, "logged": logged}


print(json.dumps({"shuffled": run(True), "ordered": run(False)}))
