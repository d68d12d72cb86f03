"""TRL's GRPO quickstart with a custom reward reading a dataset column, on a local model and dataset."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Write about the number {i}.", "ground_truth": str(i)} for i in range(8)])


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_match(completions, ground_truth, **kwargs):
    return [1.0 if truth in completion else 0.0 for completion, truth in zip(completions, ground_truth)]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=8, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=[reward_len, reward_match], args=training_args,
                      train_dataset=dataset)
trainer.train()
trainer.save_model()
print(json.dumps({"global_step": trainer.state.global_step,
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
