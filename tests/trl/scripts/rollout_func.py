"""TRL's rollout_func: the completions come from a function (here scripted from the prompt's text), its extra keys
reach the reward functions as columns."""
import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i % 2 + 1}."}]} for i in range(8)])
calls, seen = [], []


def scripted_rollout(prompts, trainer):
    tokenizer = trainer.processing_class
    texts = [" ".join(str(k) for k in range(1, int(p[-1]["content"][9]) + 1)) for p in prompts]
    prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
                  for p in prompts]
    completion_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    calls.append(len(prompts))
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids], "source": ["scripted"] * len(prompts)}


def reward_count(completions, source, **kwargs):
    seen.extend((c[0]["content"], s) for c, s in zip(completions, source))
    return [float(len(c[0]["content"])) for c in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=8, num_generations=2,
                           max_completion_length=8, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_count, args=training_args, train_dataset=dataset,
                      rollout_func=scripted_rollout)
trainer.train()
print(json.dumps({"global_step": trainer.state.global_step, "calls": calls,
                  "seen": sorted(set(map(tuple, seen))),
                  "metrics": sorted({k for entry in trainer.state.log_history if "loss" in entry for k in entry})}))
