"""Does RFT learn on the learn suite's task, counted in SFT steps rather than seconds (issue 52, item 3)?

    .venv/bin/python scripts/learn_rft_check.py [PROMPTS TEMPERATURE STEPS OUT.json]    # default: 16 0.7 12

Samples the learn suite's k completions for each of the first PROMPTS train prompts of `examples/keyword` from
SmolLM2-135M-Instruct (`make smollm2`) at TEMPERATURE, keeps the best of each that scores `keep_min` (1.0), then for
seeds 0 and 1 trains fresh LoRA adapters for STEPS SFT steps on batches drawn from what was kept and evaluates the
held-out reward as the suite does (`jaxcore.bench.learn`: the same sampling, SFT step and evaluation). Prints and
writes the sampling's yield, each seed's losses and held-out reward, and the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from jaxcore.bench import learn


def main(n_prompts: int = 16, temperature: float = 0.7, steps: int = 12, out: str = "runs/learn_rft_check.json"
         ) -> dict:
    path = Path("models/smollm2-135m-instruct")
    reward = learn.reward_function()
    s = {**learn.method_settings("rft"), "temperature": temperature}
    log: dict = {"settings": s, "prompts": n_prompts, "sft_steps": steps}
    torch.manual_seed(0)
    model, tokenizer, _ = learn.rft_model(path, "float32", s)
    began = time.time()
    kept, rewards, texts = learn.rft_sample(model, tokenizer, learn.read_rows("train.jsonl")[:n_prompts], s, reward)
    k = s["k"]
    best = [max(rewards[i * k:(i + 1) * k]) for i in range(n_prompts)]
    log["sample"] = {"seconds": round(time.time() - began, 1), "load_average": os.getloadavg(),
                     "mean_reward": statistics.fmean(rewards), "best_of_k_mean": statistics.fmean(best),
                     "prompts_with_a_full_score": sum(b >= s["keep_min"] for b in best), "kept_texts": texts}
    print(json.dumps(log["sample"]), flush=True)
    if not kept:
        raise SystemExit("nothing kept: no prompt had a sample scoring keep_min")
    log["seeds"] = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        model, tokenizer, optimizer = learn.rft_model(path, "float32", s)
        order = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(steps):
            batch = [kept[i] for i in torch.randperm(len(kept), generator=order)[:s["batch"]].tolist()]
            losses.append(round(learn.rft_sft_step(model, optimizer, tokenizer, batch), 4))
        after = learn.torch_evaluation(lambda model=model: model, tokenizer, s, reward)()
        log["seeds"][seed] = {"losses": losses, "held_out_after": after, "load_average": os.getloadavg()}
        print(seed, json.dumps(log["seeds"][seed]), flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(log, indent=1) + "\n")
    return log


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(args[0]), float(args[1]), int(args[2]), args[3]) if args else ())
