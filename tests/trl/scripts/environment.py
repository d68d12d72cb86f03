"""TRL's GRPO with environment_factory: each episode gets its own environment, whose methods are the tools and
which a reward function reads through `environments`."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


class CounterEnv:
    def __init__(self):
        self.count = 0

    def reset(self, **kwargs):
        self.count = 0

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The new count.
        """
        self.count += step
        return str(self.count)


def reward_count(environments, **kwargs):
    return [float(env.count) for env in environments]


dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(8)])
training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=16, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_count, args=training_args, train_dataset=dataset,
                      environment_factory=CounterEnv)
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step,
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
