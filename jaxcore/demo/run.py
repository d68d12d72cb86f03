"""The main job: EGGROLL on a tiny local model, evaluated before and after with transformers.

1. write a tiny Llama-family HF checkpoint (random weights, byte-level tokenizer): nothing downloaded;
2. warm-start it honestly with a short supervised run on 2-digit addition (a random model cannot
   add at all, so ES would have no signal), save it as HF and convert it to a jaxcore checkpoint;
3. train with EGGROLL, the population sharded over every device (8 simulated CPU devices here);
4. export the result to HF and score both models on held-out prompts with torch generations.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import jax

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DemoConfig:
    out_dir: str = "runs/demo"
    seed: int = 0
    warm_steps: int = 250
    warm_batch: int = 64
    warm_lr: float = 3e-3
    epochs: int = 150
    population: int = 128
    sigma: float = 0.02
    learning_rate: float = 2e-3
    prompts_per_epoch: int = 128
    eval_prompts: int = 256
    eval_every: int = 25


def warm_start(model: Any, tokenizer: Any, task: Any, cfg: DemoConfig) -> list[float]:
    """Supervised steps on training examples (answers with EOS), returning the losses."""
    from jaxcore.demo.sft import sft_batch, supervised_finetune

    def batches(step: int):
        examples = task.examples("train", cfg.warm_batch, cfg.seed * 100_003 + step)
        return sft_batch(tokenizer, [e.prompt for e in examples], [str(e.answer) for e in examples],
                         tokenizer.eos_token_id)

    return supervised_finetune(model, batches, steps=cfg.warm_steps, learning_rate=cfg.warm_lr)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    import jaxcore
    from jaxcore.api import ESTrainer
    from jaxcore.es.config import ESConfig
    from jaxcore.hf.model_checkpoint import save_model
    from jaxcore.hf.tiny import write_tiny_checkpoint
    from jaxcore.hf.tokenization import load_tokenizer
    from jaxcore.outputs import write_text
    from jaxcore.rewards import get_task
    from jaxcore.runtime.evaluation import EVAL_SEED
    from torchref.evaluate import evaluate_with_transformers

    began = time.perf_counter()
    out = Path(cfg.out_dir)
    shutil.rmtree(out / "es", ignore_errors=True)      # a fresh run each time (the ES stage refuses old checkpoints)
    task = get_task("addition", digits=2)
    print(f"[1/4] tiny Llama checkpoint + byte-level tokenizer -> {out / 'base_hf'}", flush=True)
    base = write_tiny_checkpoint(out / "base_hf", "llama", preset="tiny", seed=cfg.seed)
    model = jaxcore.load_hf(base)
    tokenizer = load_tokenizer(base)
    print(f"[2/4] supervised warm start: {cfg.warm_steps} steps on 2-digit addition", flush=True)
    losses = warm_start(model, tokenizer, task, cfg)
    warm_hf = jaxcore.save_hf(model, out / "warm_hf", tokenizer_dir=base)
    warm_ckpt = save_model(model, out / "warm_ckpt", tokenizer_dir=base)
    print(f"      loss {losses[0]:.3f} -> {losses[-1]:.3f}; converted to jaxcore checkpoint {warm_ckpt}", flush=True)

    es_cfg = ESConfig()
    es_cfg.model.path = str(warm_ckpt)
    es_cfg.task.name, es_cfg.task.options = "addition", {"digits": 2}
    es_cfg.rollout.prompts_per_epoch, es_cfg.rollout.max_new_tokens = cfg.prompts_per_epoch, 4
    es_cfg.es.population, es_cfg.es.sigma, es_cfg.es.rank = cfg.population, cfg.sigma, 1
    es_cfg.optimizer.name, es_cfg.optimizer.learning_rate = "adam", cfg.learning_rate
    t = es_cfg.train
    t.epochs, t.seed, t.out_dir, t.eval_prompts = cfg.epochs, cfg.seed, str(out / "es"), cfg.eval_prompts
    t.eval_every, t.checkpoint_every = cfg.eval_every, cfg.eval_every
    print(f"[3/4] EGGROLL: population {cfg.population} over {jax.device_count()} devices, {cfg.epochs} epochs",
          flush=True)
    summary = ESTrainer(args=es_cfg).train()

    print("[4/4] held-out evaluation with transformers (torch), greedy", flush=True)
    # The runner's held-out prompts (drawn with EVAL_SEED whatever the run's seed), so that the torch scores and
    # the run's own jax evaluation are of the same prompts: with cfg.seed here they differed for any seed but 0.
    held_out = task.examples("eval", cfg.eval_prompts, EVAL_SEED)
    evaluate = (lambda path: evaluate_with_transformers(path, held_out, task.reward_fns, task.reward_weights,
                                                        max_new_tokens=4))
    before, after = evaluate(warm_hf), evaluate(summary["final_hf"])
    result = {"reward_before": before["reward"], "reward_after": after["reward"], "epochs": cfg.epochs,
              "seconds": round(time.perf_counter() - began, 1), "devices": jax.device_count(),
              "population": cfg.population, "held_out_prompts": len(held_out), "warm_start_steps": cfg.warm_steps,
              "jax_eval_reward_after": summary.get("eval_reward_after"), "final_hf": summary["final_hf"],
              "samples_after": after["samples"]}
    write_text(out / "summary.json", json.dumps(result, indent=2) + "\n", overwrite=True, name="--out's summary.json")
    print_table(result)
    return result


def print_table(result: dict[str, Any]) -> None:
    gain = result["reward_after"] - result["reward_before"]
    rows = [("held-out exact match (torch)", f"{result['reward_before']:.3f}", f"{result['reward_after']:.3f}",
             f"{gain:+.3f}")]
    print(f"\n{'':32s}{'before':>10s}{'after':>10s}{'change':>10s}")
    for name, *cells in rows:
        print(f"{name:32s}" + "".join(f"{c:>10s}" for c in cells))
    print(f"\n{result['epochs']} ES epochs on {result['devices']} devices in {result['seconds']} s; "
          f"exported model: {result['final_hf']}")
    for sample in result["samples_after"][:3]:
        print(f"  {sample['prompt']}{sample['completion']}")

