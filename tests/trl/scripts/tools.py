"""TRL's GRPO with a tool function (type hints and a Google-style docstring: its schema), on conversational data."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of a and b.
    """
    return a * b


dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} times 7?"}]} for i in range(8)])


def reward_short(completions, **kwargs):
    return [-float(len(str(completion))) for completion in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=16, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_short, args=training_args, train_dataset=dataset,
                      tools=[multiply])
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step,
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
