"""TRL's conversational GRPO example: prompts as chat messages, a reward reading the assistant message."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say the number {i}."}]} for i in range(8)])


def reward_short(completions, **kwargs):
    return [-float(len(completion[0]["content"])) for completion in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=2,
                           gradient_accumulation_steps=2, max_completion_length=6, num_train_epochs=1,
                           report_to="none", save_strategy="no", logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_short, args=training_args, train_dataset=dataset)
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step,
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
