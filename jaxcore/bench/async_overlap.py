"""Asynchronous GRPO against the synchronous run (`jaxcore bench --suite async`, issue 53): the same GRPO job on
the same 8 simulated CPU devices, synchronously (every device generates, then every device trains) and
asynchronously (4 devices generate while the other 4 train, `grpo.asynchronous`), each run a fresh process.

Reported for each: tokens per second (TRL's `num_tokens`, prompt and completion, trained after the first step,
over the seconds from the first step's end to the last's). For the asynchronous run, from its timeline (when each
batch's generation and each trainer step ran, `AsyncGRPOAlgorithm`'s `async/*_began_s` / `_ended_s`): the share of
the wall time after the first batch during which generation and training both ran (`overlap_share`), each side's
idle share, the logged waits (the trainer's for data, the rollout's for weights) and the weight syncs' seconds.
For the synchronous run, the share of its steps spent generating (the training side's idle share). Timing on a
shared machine moves every figure; the load average is recorded with each run.

The task is `examples/keyword` (the learn suite's: chat prompts asking for a sentence with two given words, the
user's reward file), the rollout at temperature 1 (asynchronous GRPO's only one), learning rate 2e-5. The job
(8 prompts x 8 completions, 8 new tokens, max_staleness 2) is sized so that a batch generates on the 4 rollout
devices in about the time a step trains on the other 4: overlap needs sides of equal speed, and max_staleness 2
(TRL's default is 4) lets the rollout run a batch ahead where one side's step is slower than the other's. Before
the timed runs, each kind of job runs once untimed (`warm_up`), so that every timed run finds the persistent
compilation cache as a user's second run does.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxcore.bench import BenchOptions, bench_checkpoint, device_info
from jaxcore.bench.child import run_in_child
from jaxcore.bench.timeline import overlap_figures, plot_timeline

DEVICES, ROLLOUT_DEVICES = 8, 4
DEFAULT_STALENESS = (2,)


def settings(options: BenchOptions) -> dict[str, Any]:
    """The compared job: prompts x generations per step (a multiple of the 8 devices), new tokens, steps per run
    (`options.steps` overrides), the max_staleness of each asynchronous run (`options.max_staleness`) and the
    weight_sync_steps (`options.weight_sync_steps`, default 1)."""
    staleness = options.max_staleness or DEFAULT_STALENESS
    sync_steps = options.weight_sync_steps or 1
    if options.quick:
        return {"prompts": 2, "generations": 4, "max_new_tokens": 4, "steps": options.steps or 3,
                "max_staleness": list(staleness), "weight_sync_steps": sync_steps}
    return {"prompts": 8, "generations": 8, "max_new_tokens": 8, "steps": options.steps or 12,
            "max_staleness": list(staleness), "weight_sync_steps": sync_steps}


def child_env() -> dict[str, str]:
    """The child's environment: 8 simulated CPU devices (any other XLA flag kept)."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", "")).strip()
    return {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip(), "JAX_PLATFORMS": "cpu"}


def grpo_run(path: str, dtype: str, prompts: int, generations: int, max_new_tokens: int, steps: int,
             max_staleness: int | None, weight_sync_steps: int, out: Path) -> dict[str, Any]:
    """One run (a child process's): `steps` GRPO steps on the keyword task, synchronous when `max_staleness` is
    None, else asynchronous on 4 + 4 devices; every step's logged row, with the load average before and after."""
    import jaxcore
    from jaxcore.bench.learn import REWARD, TASK_DIR, read_rows
    from jaxcore.grpo.async_config import AsyncOptions
    from jaxcore.runtime.metrics import read_metrics

    load_before = [round(x, 2) for x in os.getloadavg()]
    cfg = jaxcore.GRPOConfig()
    cfg.model.path, cfg.model.dtype = path, dtype
    r = cfg.rollout
    r.prompts_per_epoch, r.generations_per_prompt, r.max_new_tokens, r.temperature = \
        prompts, generations, max_new_tokens, 1.0
    cfg.grpo.loss_type, cfg.grpo.beta = "dapo", 0.0
    cfg.optimizer.learning_rate, cfg.optimizer.schedule = 2e-5, "constant"
    if max_staleness is not None:
        cfg.grpo.asynchronous = AsyncOptions(rollout_devices=ROLLOUT_DEVICES, max_staleness=max_staleness,
                                             weight_sync_steps=weight_sync_steps)
    t = cfg.train
    t.epochs, t.out_dir, t.eval_every, t.checkpoint_every = steps, str(out), -1, -1
    t.progress, t.tensorboard, t.export_hf = False, False, False
    rows = read_rows("train.jsonl")
    trainer = jaxcore.GRPOTrainer(model=path, reward_funcs=[str(TASK_DIR / REWARD)], train_dataset=rows,
                                  eval_dataset=rows[:4], args=cfg)
    trainer.train()
    logged = [row for row in read_metrics(out / "metrics.jsonl") if "step_time" in row]
    keep = ("step", "run_time", "step_time", "num_tokens", "reward", "loss", "timing/rollout", "timing/compile")
    return {"rows": [{k: v for k, v in row.items() if k in keep or k.startswith(("async/", "sample/"))}
                     for row in logged],
            "load_average": [load_before, [round(x, 2) for x in os.getloadavg()]]}


def tokens_per_s(rows: list[dict[str, Any]]) -> float:
    """Tokens trained after the first step over the seconds from its end to the last step's."""
    first, last = rows[0], rows[-1]
    return (last["num_tokens"] - first["num_tokens"]) / (last["run_time"] - first["run_time"])


def sync_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The synchronous run: tokens per second, and the share of its steps after the first spent generating (the
    training side's idle time: every device generates, then trains)."""
    later = rows[1:]
    return {"tokens_per_s": round(tokens_per_s(rows), 2),
            "generation_share": round(sum(r["timing/rollout"] for r in later) / sum(r["step_time"] for r in later), 3),
            "median_step_s": round(statistics.median(r["step_time"] for r in later), 4),
            "compile_s_after_first_step": round(sum(r.get("timing/compile", 0.0) for r in later), 2)}


def intervals(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """An asynchronous run's timeline from its logged rows: each batch's generation, each trainer step."""
    return {"generation": [(r["async/generate_began_s"], r["async/generate_ended_s"]) for r in rows
                           if "async/generate_began_s" in r],
            "training": [(r["async/train_began_s"], r["async/train_ended_s"]) for r in rows]}


def async_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The asynchronous run: tokens per second, the timeline's overlap and idle shares, the logged waits after the
    first step as shares of the window after the first batch, and the weight syncs."""
    lanes = intervals(rows)
    timeline = overlap_figures(lanes["generation"], lanes["training"])
    window, later = timeline["window_s"], rows[1:]
    syncs = rows[-1]["async/weight_syncs"]
    sync_s = [r["async/weight_sync_s"] for r in rows if r["async/weight_sync_s"] > 0]
    return {"tokens_per_s": round(tokens_per_s(rows), 2), **{k: round(v, 3) for k, v in timeline.items()},
            "trainer_wait_share": round(sum(r["async/trainer_wait_s"] for r in later) / window, 3),
            "rollout_wait_share": round(sum(r["async/rollout_wait_s"] for r in later) / window, 3),
            "weight_syncs": syncs, "weight_sync_s_mean": round(statistics.mean(sync_s), 4) if sync_s else 0.0,
            "staleness_mean": round(statistics.mean(r["sample/staleness_mean"] for r in rows), 3),
            "median_step_s": round(statistics.median(r["step_time"] for r in later), 4),
            "compile_s_after_first_step": round(sum(r.get("timing/compile", 0.0) for r in later), 2),
            "timeline": {lane: [[round(a, 3), round(b, 3)] for a, b in got] for lane, got in lanes.items()}}


def warm_up(spec: dict[str, Any], staleness: list[int], tmp: Path) -> float:
    """One short untimed run of each kind of job (synchronous; asynchronous, whose programs are the same at any
    max_staleness) to fill the persistent compilation cache; its seconds. Long enough for every program: the
    on-policy first batches and the stale ones after."""
    began = time.perf_counter()
    for name, lag in (("sync", None), ("async", max(staleness))):
        print(f"async: warming up {name}", flush=True)
        job = {**spec, "steps": max(staleness) + 2, "max_staleness": lag}
        run_in_child("jaxcore.bench.async_overlap:grpo_run", job, tmp / f"warm_{name}", child_env())
    return time.perf_counter() - began


def run(options: BenchOptions) -> dict[str, Any]:
    path = bench_checkpoint(options)
    s = settings(options)
    spec = {"path": str(path), "dtype": options.dtype, "prompts": s["prompts"], "generations": s["generations"],
            "max_new_tokens": s["max_new_tokens"], "steps": s["steps"], "weight_sync_steps": s["weight_sync_steps"]}
    results: dict[str, Any] = {"async.settings": {**s, "model": str(path), "devices": DEVICES,
                                                  "rollout_devices": ROLLOUT_DEVICES}}
    lanes: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not options.quick:
            results["async.warm_up_s"] = round(warm_up(spec, s["max_staleness"], Path(tmp)), 1)
        runs = [("sync", None)] + [(f"staleness_{lag}", lag) for lag in s["max_staleness"]]
        for name, lag in runs:
            print(f"async: {name}", flush=True)
            got = run_in_child("jaxcore.bench.async_overlap:grpo_run", {**spec, "max_staleness": lag},
                               Path(tmp) / name, child_env())
            figures = sync_figures(got["rows"]) if lag is None else async_figures(got["rows"])
            figures.update({"wall_s": round(got["wall_s"], 2), "load_average": got["load_average"],
                            "steps": len(got["rows"]),
                            "compile_s_first_step": round(got["rows"][0].get("timing/compile", 0.0), 2)})
            results.update({f"async.{name}.{k}": v for k, v in figures.items()})
            if lag is not None:
                results[f"async.{name}.tokens_per_s_over_sync"] = round(
                    figures["tokens_per_s"] / results["async.sync.tokens_per_s"], 3)
                lanes[f"asynchronous, max_staleness {lag}"] = figures["timeline"]
    results["async.timeline_png"] = plot_timeline(lanes, Path(options.workdir) / "async_timeline.png")
    results["async.device"] = device_info()
    return results
