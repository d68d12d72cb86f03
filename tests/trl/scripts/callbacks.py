"""A GRPO script with a transformers TrainerCallback that records the rewards it is shown and ends training early
(control.should_training_stop), as scripts do for early stopping."""
import json
import sys

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Write about the number {i}."} for i in range(8)])


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


class StopAfterTwoSteps(TrainerCallback):
    def __init__(self):
        self.calls, self.rewards = [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.calls.append("on_train_begin")

    def on_step_end(self, args, state, control, **kwargs):
        self.calls.append("on_step_end")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "reward" in logs:
            self.rewards.append(logs["reward"])
        if state.global_step >= 2:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.calls.append("on_train_end")


stopper = StopAfterTwoSteps()
training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=6, max_steps=5, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=training_args, train_dataset=dataset,
                      callbacks=[stopper])
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step, "calls": stopper.calls,
                  "rewards_seen": len(stopper.rewards)}))
