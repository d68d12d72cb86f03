"""TRL's log_completions: each logging step's prompts, completions, rewards and advantages as a parquet file in
output_dir/completions/, and a sample of num_completions_to_print printed with rich."""
import json
import sys
from pathlib import Path

import pandas as pd
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say the number {i}."}]} for i in range(8)])


def reward_short(completions, **kwargs):
    return [-float(len(completion[0]["content"])) for completion in completions]


training_args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=6, max_steps=2, report_to="none", save_strategy="no",
                           logging_steps=1, use_cpu=True, log_completions=True, num_completions_to_print=2)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_short, args=training_args, train_dataset=dataset)
trainer.train()
files = sorted((Path(sys.argv[2]) / "completions").glob("*.parquet"))
tables = [pd.read_parquet(f) for f in files]
print(json.dumps({"global_step": trainer.state.global_step, "files": [f.name for f in files],
                  "columns": [list(t.columns) for t in tables], "rows": [len(t) for t in tables],
                  "steps": [sorted(set(t["step"].tolist())) for t in tables],
                  "roles": [sorted({m["role"] for c in t["completion"] for m in c}) for t in tables],
                  "reward_is_length": all(abs(r + len(c[0]["content"])) < 1e-6 for t in tables
                                          for r, c in zip(t["reward_short"], t["completion"]))}))
