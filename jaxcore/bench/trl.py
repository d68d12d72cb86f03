"""GRPO against TRL's own trainer: `trl.GRPOTrainer` and `jaxcore.GRPOTrainer` on the same model, prompts,
reward function and settings, whole training steps (generation, scoring, update) timed on both sides.

`run(options)` -> {"trl.trl_step_over_jax": TRL's median step / jaxcore's median step, ...} for each regime:
`fill` (learning rate 1e-6: completions keep filling `max_new_tokens`) and `short` (3e-5 with a brevity
reward: completions collapse to a few tokens within a few steps, where padded work would show). The sides
run alternately (TRL, jaxcore, TRL, jaxcore, ... `rounds` times), each run's first step (compilation,
warm-up) left out of the median. Every run is a fresh Python process, as a user's is: TRL's with glibc's
allocator as TRL's users have it (`JAXCORE_HOST_MALLOC=system`), jaxcore's with the policy `import jaxcore`
sets (`jaxcore.runtime.host_allocator`; `trl.host_malloc` says what each side ran with). Needs `trl`
(`pip install 'jaxcore[trl]'`). Settings as in TRL's examples: 2 prompts x 8 generations, temperature 1,
loss `dapo`, beta 0, AdamW, fp32 on CPU, no checkpoints (TRL's save_strategy "no", jaxcore's
checkpoint_every -1).

Beside the median step, what a user feels: each run's whole wall time from its process's start (imports,
loading and compilation included; `..._wall_s`, and `jax_over_trl_wall`), jaxcore's seconds making programs
on the critical path (`jax_compile_share` of its wall time), and every step's reward against the wall-clock
seconds since its process started (`..._reward_time`, drawn in `trl_reward_vs_time.png` under the workdir).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxcore.bench import BenchOptions, bench_checkpoint, device_info
from jaxcore.bench.child import run_in_child, since_start
from jaxcore.bench.curves import plot_reward_vs_time
from jaxcore.runtime import host_allocator

PROMPTS = ["Explain in detail how a bicycle works.", "Describe a busy city street in the morning."]   # long answers
REGIMES = {"fill": 1e-6, "short": 3e-5}


def brevity(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    """TRL-style reward: 1 for an empty completion, falling with every word (a conversational completion's: its
    message's)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [1.0 / (1.0 + len(text.split())) for text in texts]


def prompts_of(conversational: bool) -> list[Any]:
    """The compared prompts: plain strings, or each as a user message (TRL's conversational format)."""
    return [[{"role": "user", "content": p}] for p in PROMPTS] if conversational else list(PROMPTS)


def settings(options: BenchOptions) -> dict[str, Any]:
    """The compared job: steps per run of each regime (10 filling; 24 short, so that the median step falls
    after the collapse in both trainers: the step at which a run's completions collapse varies with its random
    stream, 5-7 in the runs seen, and 12 steps left the median on that step; `options.steps` sets both, e.g. 12
    for whole-run wall times), completion lengths, rounds (quick: tiny shapes for the tests)."""
    if options.quick:
        return {"steps": {"short": options.steps or 2}, "completion_lengths": (4,), "rounds": 1, "generations": 4,
                "regimes": ("short",)}
    steps = {"fill": 10, "short": 24} if options.steps is None else dict.fromkeys(REGIMES, options.steps)
    return {"steps": steps, "completion_lengths": (16, 128), "rounds": 2, "generations": 8, "regimes": tuple(REGIMES)}


def rounds_for(s: dict[str, Any], completion_len: int) -> int:
    """Alternated rounds: as set for short completions, one for long ones (a TRL step at 128 tokens takes
    about a minute on two CPU cores)."""
    return s["rounds"] if completion_len <= 32 else 1


def _step_timer() -> Any:
    """A `TrainerCallback` recording each optimisation step's wall time (generation, scoring and update: TRL's
    whole step) and when it ended, in seconds since the process started (transformers imported here, so that
    jaxcore's child process never pays for it)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.ended: list[float] = []
            self._began = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self._began = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.times.append(time.perf_counter() - self._began)
            self.ended.append(since_start())

    return StepTimer()


def trl_run(path: Path, lr: float, completion_len: int, steps: int, generations: int, out: Path,
            conversational: bool = False) -> dict[str, list[float]]:
    """`steps` steps of TRL's GRPOTrainer: per-step wall times, mean rewards, and when each step ended."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    args = TRLConfig(output_dir=str(out), per_device_train_batch_size=len(PROMPTS) * generations,
                     num_generations=generations, max_completion_length=completion_len, temperature=1.0,
                     learning_rate=lr, beta=0.0, loss_type="dapo", max_steps=steps, logging_steps=1,
                     save_strategy="no", report_to=[], seed=0, bf16=False, fp16=False,
                     use_cpu=not torch.cuda.is_available(), disable_tqdm=True, dataloader_num_workers=0)
    timer = _step_timer()
    trainer = TRLTrainer(model=str(path), reward_funcs=[brevity], args=args,
                         train_dataset=Dataset.from_dict({"prompt": prompts_of(conversational) * steps}),
                         callbacks=[timer])
    trainer.train()
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {"step_s": timer.times, "reward": rewards, "step_ended_s": timer.ended, "compile_s": [0.0] * steps}


def jax_run(path: Path, lr: float, completion_len: int, steps: int, generations: int, out: Path,
            compilation_cache: str | None = None, conversational: bool = False) -> dict[str, Any]:
    """`steps` epochs (one rollout and one optimiser step each) of jaxcore's GRPOTrainer; `compilation_cache`
    (None: the default) is `train.compilation_cache`, and the result's `compilation_cache` says how it served
    the run (`jaxcore.runtime.compile_cache.stats`)."""
    import jaxcore
    from jaxcore.runtime import compile_cache
    from jaxcore.runtime.metrics import read_metrics

    args = jaxcore.GRPOConfig()
    args.rollout.prompts_per_epoch, args.rollout.generations_per_prompt = len(PROMPTS), generations
    args.rollout.max_new_tokens, args.rollout.temperature = completion_len, 1.0
    args.grpo.loss_type, args.grpo.beta = "dapo", 0.0
    args.optimizer.learning_rate = lr
    t = args.train
    t.epochs, t.out_dir, t.eval_every, t.checkpoint_every = steps, str(out), -1, -1
    t.progress, t.tensorboard, t.export_hf = False, False, False
    if compilation_cache is not None:
        t.compilation_cache = compilation_cache
    rows = [{"prompt": p} for p in prompts_of(conversational)]   # no held-out evaluation (eval_every=-1), as TRL
    trainer = jaxcore.GRPOTrainer(model=str(path), reward_funcs=[brevity], train_dataset=rows, eval_dataset=rows,
                                  args=args)
    summary = trainer.train()
    rows = [row for row in read_metrics(out / "metrics.jsonl") if "step_time" in row]
    return {"step_s": [row["step_time"] for row in rows], "reward": [row["reward"] for row in rows],
            "step_ended_s": [row.get("run_time", float("nan")) for row in rows],
            "compile_s": [row.get("timing/compile", 0.0) for row in rows],
            "time_to_first_step": summary.get("time_to_first_step"), "making_programs": summary.get("compile"),
            "compilation_cache": compile_cache.stats()}


def run_side(side: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One side's run (`trl_run` or `jax_run` with `spec`) in a fresh process (`jaxcore.bench.child`), TRL's with
    glibc's own allocator."""
    env = {host_allocator.ENV: "system"} if side == "trl" else {}
    spec = dict(spec)
    out = Path(spec.pop("out"))
    return run_in_child(f"jaxcore.bench.trl:{side}_run", spec, out, env)


def run(options: BenchOptions) -> dict[str, Any]:
    try:
        import trl  # noqa: F401
    except ImportError as err:
        from jaxcore.errors import UserError

        raise UserError("--suite trl compares against TRL's own GRPOTrainer and needs trl: "
                        "pip install 'jaxcore[trl]'") from err
    path = bench_checkpoint(options)
    s = settings(options)
    chat = options.conversational
    results: dict[str, Any] = {"trl.settings": {**s, "prompts": prompts_of(chat), "model": str(path)}}
    host_malloc: dict[str, str] = {}
    curves: dict[str, dict[str, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for length in s["completion_lengths"]:
            for regime in s["regimes"]:
                lr, key = REGIMES[regime], f"trl.{'chat_' if chat else ''}{regime}_{length}"
                runs: dict[str, list[dict[str, Any]]] = {"trl": [], "jax": []}
                rounds = rounds_for(s, length)
                for round_ in range(rounds):
                    for side in ("trl", "jax"):
                        print(f"{key}: {side} round {round_ + 1}/{rounds}", flush=True)
                        spec = {"path": str(path), "lr": lr, "completion_len": length, "steps": s["steps"][regime],
                                "generations": s["generations"], "out": str(Path(tmp) / f"{key}-{side}-{round_}"),
                                "conversational": chat}
                        if side == "jax":
                            spec["compilation_cache"] = options.compilation_cache
                        got = run_side(side, spec)
                        host_malloc[side] = got["host_malloc"]
                        runs[side].append(got)
                results.update(regime_results(key, runs))
                curves[key] = {side: [[got["step_ended_s"], got["reward"]] for got in runs[side]] for side in runs}
    results["trl.reward_vs_time_png"] = plot_reward_vs_time(curves, Path(options.workdir) / "trl_reward_vs_time.png",
                                                           {"trl": "TRL", "jax": "jaxcore"}, title_prefix="trl.")
    results["trl.host_malloc"] = host_malloc
    results["trl.device"] = device_info()
    return results


def regime_results(key: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One regime's figures from both sides' runs: the median step (each run's first step, which compiles and warms
    up, left out), the whole runs' wall times and their ratio, jaxcore's share of its wall time spent making
    programs, and every run's steps, rewards and reward-against-time curve."""
    def steps(side: str) -> list[float]:
        return [t for got in runs[side] for t in got["step_s"][1:]]

    trl_s, jax_s = (statistics.median(steps(side)) for side in ("trl", "jax"))
    wall = {side: statistics.median(got["wall_s"] for got in runs[side]) for side in runs}
    out: dict[str, Any] = {
        f"{key}.trl_step_over_jax": round(trl_s / jax_s, 3), f"{key}.trl_median_step_s": round(trl_s, 4),
        f"{key}.jax_median_step_s": round(jax_s, 4),
        f"{key}.trl_wall_s": round(wall["trl"], 2), f"{key}.jax_wall_s": round(wall["jax"], 2),
        f"{key}.jax_over_trl_wall": round(wall["jax"] / wall["trl"], 3),
        f"{key}.jax_compile_share": round(statistics.median(
            got["making_programs"]["main_s"] / got["wall_s"] for got in runs["jax"]), 3),
        f"{key}.jax_time_to_first_step_s": [round(got["time_to_first_step"], 2) for got in runs["jax"]],
        f"{key}.jax_making_programs": [got["making_programs"] for got in runs["jax"]],
        f"{key}.jax_compilation_cache": [got["compilation_cache"] for got in runs["jax"]]}
    for side in ("trl", "jax"):
        out[f"{key}.{side}_reward"] = [r for got in runs[side] for r in got["reward"]]
        out[f"{key}.{side}_step_s"] = steps(side)
        out[f"{key}.{side}_run_wall_s"] = [round(got["wall_s"], 2) for got in runs[side]]
        out[f"{key}.{side}_reward_time"] = [[[round(t, 2) for t in got["step_ended_s"]], got["reward"]]
                                           for got in runs[side]]
    return out
