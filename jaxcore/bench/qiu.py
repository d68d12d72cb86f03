"""jaxcore's EGGROLL against Qiu et al.'s ES loop (`torchref.qiu_es`): wall time of one ES iteration each.

Both sides run the same model (options.preset; `smollm2-135m-instruct` is the real model from models/), the
same prompts (the built-in addition task, "12+34=" -> "46"), the same reward (exact match + digit match),
population, sigma, alpha (= jaxcore's SGD learning rate), greedy completions of the same length, the same
iteration count, iterations alternated (Qiu, jaxcore, Qiu, ...) so that load from other processes hits both.

- Qiu: one iteration of their Algorithm 1 on the HF torch model: for each member in turn, full-rank Gaussian
  noise added in place, HF `generate`, noise removed in place; z-scored rewards; the update regenerates
  every member's noise.
- jaxcore: one `EggrollAlgorithm.train_step` (what `jaxcore.ESTrainer` runs each epoch): the whole population
  generated as one batch through low-rank perturbations, scored, the EGGROLL update (rank 1, matrices only,
  embeddings and norms frozen: jaxcore's defaults). Its compilation is done beforehand in two untimed
  warm-up steps whose weight updates are undone (`qiu.jax_compile_s`).

qiu.iteration_s / qiu.jax_iteration_s: best wall time of one iteration over the run's iterations (as the
other suites take the best of their rounds: on a shared machine, other processes' load only adds time, and
torch's generate suffers from it far more than XLA's); qiu.jax_speedup: their ratio (issue 20's target: >= 20
at population 30, 2 prompts, 32 new tokens on SmolLM2-135M-Instruct on a CPU); qiu.jax_speedup_median: the
ratio of the medians; qiu.iteration_times / qiu.jax_iteration_times: every iteration's time.
qiu.rewards / qiu.jax_rewards: each iteration's mean population reward (the reward curves).

What a user waits for: `qiu.jax_whole_run_s`, jaxcore's same job run by `jaxcore.ESTrainer` in a fresh process
(imports, loading and compilation included, from the process's start), against `qiu.whole_run_s`, Qiu's loading
and iterations in this process (its imports, done before, are not counted); `qiu.jax_over_qiu_whole_run`; each
side's reward against those seconds (`qiu.reward_time`, `qiu.jax_reward_time`, drawn in `qiu_reward_vs_time.png`
under the workdir).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxcore.bench import BenchOptions, bench_checkpoint, device_info, model_summary, torch_device
from jaxcore.bench.child import run_in_child
from jaxcore.bench.curves import plot_reward_vs_time

SIGMA, ALPHA = 1e-3, 5e-4          # the paper's settings (N = 30, sigma 0.001, alpha 0.0005)


def shapes(options: BenchOptions) -> dict[str, int]:
    if options.quick:
        return {"population": 4, "prompts": 1, "new_tokens": 4, "iterations": 1}
    return {"population": 30, "prompts": 2, "new_tokens": 32, "iterations": 2}


def population_for_devices(population: int) -> int:
    """`population` rounded up to what jaxcore's ES mesh accepts: even and a multiple of the devices (e.g.
    the 8 simulated CPU devices of the tests); both sides then run this population."""
    import math

    import jax

    step = math.lcm(2, jax.device_count())
    rounded = -(-population // step) * step
    if rounded != population:
        _log(f"population {population} -> {rounded}: a multiple of {step} for {jax.device_count()} devices")
    return rounded


def _log(message: str) -> None:
    print(f"[qiu] {message}", flush=True)


def es_config(s: dict[str, int]) -> Any:
    """jaxcore's config for the job: population, sigma, SGD at alpha, greedy rollouts (ES's default)."""
    from jaxcore.es.config import EggrollConfig, ESConfig
    from jaxcore.runtime.optim import OptimizerConfig

    cfg = ESConfig(es=EggrollConfig(population=s["population"], rank=1, sigma=SIGMA, seed=0),
                   optimizer=OptimizerConfig(name="sgd", learning_rate=ALPHA))
    cfg.rollout.max_new_tokens = s["new_tokens"]
    cfg.rollout.prompts_per_epoch = s["prompts"]
    cfg.train.epochs = s["iterations"]
    return cfg


def _jax_side(path: Any, options: BenchOptions, s: dict[str, int], task: Any) -> tuple[Any, Any, Any]:
    """(EggrollAlgorithm, scorer, model) for the job (`es_config`)."""
    import jaxcore
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.hf.tokenization import eos_token_ids, load_tokenizer
    from jaxcore.rewards import Scorer

    cfg = es_config(s)
    model = jaxcore.load_hf(path, dtype=options.dtype)
    tokenizer = load_tokenizer(path)
    algorithm = EggrollAlgorithm(model, tokenizer, cfg, eos_token_ids=eos_token_ids(tokenizer, model.config.hf_config))
    return algorithm, Scorer(task.reward_fns, task.reward_weights, num_workers=0), model


def _jax_iteration(algorithm: Any, epoch: int, examples: list, scorer: Any) -> tuple[float, float]:
    """(seconds, mean reward) of one jaxcore ES iteration, blocking on the updated weights."""
    import jax

    from jaxcore.model.state import flat_state

    start = time.perf_counter()
    result = algorithm.train_step(epoch, examples, scorer)
    jax.block_until_ready(flat_state(algorithm.model))
    return time.perf_counter() - start, float(result.metrics["reward"])


def _warm_up(algorithm: Any, examples: list, scorer: Any) -> float:
    """Compile jaxcore's iteration, then put the weights and optimiser state back. Two steps: the second
    epoch compiles the update once more (the updated weights come back with other shardings than the loaded
    ones, and the gradient's out_sharding is a static argument), and from the third on nothing compiles."""
    import jax
    import jax.numpy as jnp

    saved = jax.tree.map(jnp.copy, algorithm.checkpoint_state())      # the step donates the weights it updates
    seconds = sum(_jax_iteration(algorithm, epoch, examples, scorer)[0] for epoch in (0, 1))
    algorithm.restore_state(saved)
    return seconds


def jax_whole_run(path: str, s: dict[str, int], rows: list[dict[str, Any]], dtype: str, out: Path,
                  compilation_cache: str | None = None) -> dict[str, Any]:
    """The job as a user runs it, `jaxcore.ESTrainer` for s["iterations"] epochs on the same prompts and rewards
    (in a fresh process: `jaxcore.bench.child`): each epoch's mean reward and when it ended (seconds since the
    process started), its step times, and the run's time to first step and making of programs."""
    import jaxcore
    from jaxcore.runtime.metrics import read_metrics

    cfg = es_config(s)
    cfg.model.dtype = dtype
    t = cfg.train
    t.out_dir, t.eval_every, t.checkpoint_every = str(out), -1, -1
    t.progress, t.tensorboard, t.export_hf = False, False, False
    if compilation_cache is not None:
        t.compilation_cache = compilation_cache
    trainer = jaxcore.ESTrainer(model=path, reward_funcs=["exact_match", "digit_match"], train_dataset=rows,
                                eval_dataset=rows, args=cfg)
    summary = trainer.train()
    logged = [row for row in read_metrics(out / "metrics.jsonl") if "step_time" in row]
    return {"step_s": [row["step_time"] for row in logged], "reward": [row["reward"] for row in logged],
            "step_ended_s": [row["run_time"] for row in logged], "time_to_first_step": summary["time_to_first_step"],
            "making_programs": summary["compile"]}


def run(options: BenchOptions, **overrides: int) -> dict[str, Any]:
    """`qiu.jax_speedup`: Qiu's iteration time over jaxcore's, same model, population, prompts, tokens and
    reward, iterations alternated. `overrides` replace entries of `shapes(options)` (population, prompts,
    new_tokens, iterations)."""
    import torch

    from jaxcore.hf.tokenization import load_tokenizer
    from jaxcore.rewards.tasks import addition_task
    from torchref.model import load_reference
    from torchref.qiu_es import qiu_iteration

    s = {**shapes(options), **overrides}
    s["population"] = population_for_devices(s["population"])
    torch.set_num_threads(os.cpu_count() or 1)
    path = bench_checkpoint(options)
    task = addition_task(digits=2, digit_match_weight=1.0)
    examples = task.examples("train", s["prompts"], seed=0)
    prompts = [e.prompt for e in examples]
    _log(f"model {path}, population {s['population']}, {s['prompts']} prompts {prompts}, "
         f"{s['new_tokens']} new tokens, {s['iterations']} iterations, sigma {SIGMA}, alpha {ALPHA}")

    algorithm, scorer, model = _jax_side(path, options, s, task)
    compile_s = _warm_up(algorithm, examples, scorer)
    _log(f"jaxcore warm-up (compilation) {compile_s:.1f} s")

    torch_dtype = torch.bfloat16 if options.dtype == "bfloat16" else torch.float32
    began = time.perf_counter()
    hf_model = load_reference(path, dtype=torch_dtype).to(torch_device())
    hf_tokenizer = load_tokenizer(path)
    qiu_load_s = time.perf_counter() - began

    def reward_fn(completions: list[str]) -> list[float]:
        return scorer.score(completions, examples).rewards_B.tolist()

    qiu_s, jax_s, qiu_r, jax_r = [], [], [], []
    try:
        for it in range(s["iterations"]):
            out = qiu_iteration(hf_model, hf_tokenizer, prompts, reward_fn, population=s["population"], sigma=SIGMA,
                                alpha=ALPHA, max_new_tokens=s["new_tokens"], seed=it,
                                progress=_log if not options.quick else None)
            qiu_s.append(out["seconds"])
            qiu_r.append(out["mean_reward"])
            _log(f"iteration {it + 1}: Qiu {qiu_s[-1]:.2f} s, mean reward {qiu_r[-1]:.4f}")
            seconds, reward = _jax_iteration(algorithm, it, examples, scorer)
            jax_s.append(seconds)
            jax_r.append(reward)
            _log(f"iteration {it + 1}: jaxcore {jax_s[-1]:.2f} s, mean reward {jax_r[-1]:.4f}")
    finally:
        scorer.close()
    _log("jaxcore's whole run, in a fresh process")
    with tempfile.TemporaryDirectory() as tmp:
        whole = run_in_child("jaxcore.bench.qiu:jax_whole_run",
                             {"path": str(path), "s": s, "rows": [{"prompt": e.prompt, "answer": e.answer}
                                                                   for e in examples],
                              "dtype": options.dtype, "compilation_cache": options.compilation_cache}, Path(tmp))
    qiu_ended = [float(x) for x in qiu_load_s + np.cumsum(qiu_s)]
    curves = {"qiu": {"qiu": [[qiu_ended, qiu_r]], "jax": [[whole["step_ended_s"], whole["reward"]]]}}
    qiu_best, jax_best = min(qiu_s), min(jax_s)
    return {"qiu.whole_run_s": round(qiu_ended[-1], 3), "qiu.jax_whole_run_s": round(whole["wall_s"], 2),
            "qiu.jax_over_qiu_whole_run": round(whole["wall_s"] / qiu_ended[-1], 4),
            "qiu.load_s": round(qiu_load_s, 3), "qiu.jax_time_to_first_step_s": round(whole["time_to_first_step"], 2),
            "qiu.jax_making_programs": whole["making_programs"],
            "qiu.reward_time": [[round(x, 2) for x in qiu_ended], qiu_r],
            "qiu.jax_reward_time": [[round(x, 2) for x in whole["step_ended_s"]], whole["reward"]],
            "qiu.jax_whole_run_step_s": [round(x, 3) for x in whole["step_s"]],
            "qiu.reward_vs_time_png": plot_reward_vs_time(curves, Path(options.workdir) / "qiu_reward_vs_time.png",
                                                          {"qiu": "Qiu et al.", "jax": "jaxcore"}),
            "qiu.iteration_s": qiu_best, "qiu.jax_iteration_s": jax_best,
            "qiu.jax_speedup": round(qiu_best / jax_best, 2),
            "qiu.jax_speedup_median": round(statistics.median(qiu_s) / statistics.median(jax_s), 2),
            "qiu.iteration_times": [round(x, 3) for x in qiu_s],
            "qiu.jax_iteration_times": [round(x, 3) for x in jax_s],
            "qiu.rewards": qiu_r, "qiu.jax_rewards": jax_r, "qiu.jax_compile_s": round(compile_s, 2),
            "qiu.shape": {**s, "sigma": SIGMA, "alpha": ALPHA, "rank": 1, "prompt_texts": prompts,
                          "reward": "exact_match + digit_match (addition, 2 digits)"},
            "qiu.model": {**model_summary(model), "path": str(path),
                          "torch_params": int(sum(p.numel() for p in hf_model.parameters()))},
            "qiu.finite": bool(np.isfinite(qiu_r + jax_r).all()),
            "qiu.device": device_info()}

