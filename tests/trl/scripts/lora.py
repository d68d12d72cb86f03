"""TRL's GRPO with LoRA through peft_config; save_model writes the adapter."""
import json
import sys
from pathlib import Path

from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Count to {i}."} for i in range(8)])


def reward_len(completions, **kwargs):
    return [-abs(10 - len(completion)) for completion in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=6, max_steps=1, learning_rate=1e-4, report_to="none",
                           save_strategy="no", use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=training_args, train_dataset=dataset,
                      peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
trainer.train()
trainer.save_model(sys.argv[2] + "/adapter")
print(json.dumps({"global_step": trainer.state.global_step,
                  "files": sorted(p.name for p in Path(sys.argv[2], "adapter").iterdir())}))
