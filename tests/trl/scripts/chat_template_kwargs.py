"""TRL's chat_template_kwargs (as for Qwen3's enable_thinking): the model's chat template reads a variable that only
these arguments set, on conversational data."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say the number {i}."}]} for i in range(8)])


def reward_short(completions, **kwargs):
    return [-float(len(completion[0]["content"])) for completion in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=6, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True, chat_template_kwargs={"shout": True})
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_short, args=training_args, train_dataset=dataset)
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step,
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
