"""Asynchronous GRPO on the real SmolLM2-135M-Instruct (issue 53's "done when"), on 8 simulated CPU devices, 4
generating and 4 training; too heavy for CI, so a script whose results go into the report:

  python scripts/async_checks.py lag0 OUT       # lag 0 equals the synchronous run on the 4 training devices
  python scripts/async_checks.py resume OUT     # max_staleness 1, a sync every 2 steps: stopped at 3 and resumed
                                                # to 6 equals 6 straight
  python scripts/async_checks.py keyword OUT [sync|async]   # examples/keyword, the same 20 steps synchronously
                                                # and asynchronously (max_staleness 1), both training on 4 devices
                                                # (a synchronous SmolLM2 run on all 8, 8 replicated copies of the
                                                # weights and Adam state, was killed for memory on the 23 GB
                                                # machine): held-out reward at 0, 10 and 20
  python scripts/async_checks.py overlap OUT grpo.fsdp=4   # the keyword job at max_staleness 2, 8 new tokens,
                                                # 4 + 4 devices, the training group sharding the weights and Adam
                                                # state (replicated, 4 + 4 copies need more than 23 GB): the
                                                # timeline's overlap (ASYNC_CHECKS_DEVICES=4: on 2 + 2 devices)

The small shapes (2 prompts x 4 completions of 6 tokens, constant learning rate) keep lag0 and resume to minutes.
Each run is a process of its own (two runs one after another in one process reached 23 GB and were killed).
Each check prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

KEYWORD = "examples/keyword/grpo.yaml"
SMALL = ["rollout.prompts_per_epoch=2", "rollout.generations_per_prompt=4", "rollout.max_new_tokens=6",
         "train.eval_every=-1", "optimizer.schedule=constant", "train.progress=false", "train.tensorboard=false"]


def grpo(out: Path, *overrides: str, resume: bool = False, four: bool = False) -> None:
    """`jaxcore grpo` on the keyword config in a fresh process (`four`: training on the first half of the devices,
    the asynchronous run's training devices)."""
    flags = [*(["--resume"] if resume else []), *(["--four"] if four else [])]
    subprocess.run([sys.executable, __file__, "one", str(out), *flags, *overrides], check=True)


def one(out: Path, args: list[str]) -> None:
    """One run in this process: `--resume`, `--four` (the synchronous run on the training devices, the first half),
    overrides."""
    from jaxcore.cli import main

    if "--four" in args:
        import jax

        from jaxcore.grpo.algorithm import GRPOAlgorithm

        GRPOAlgorithm.training_devices = lambda self: jax.devices()[:jax.device_count() // 2]
    resume = ["--resume"] if "--resume" in args else []
    overrides = [a for a in args if a not in ("--resume", "--four")]
    cli = ["grpo", *resume, "--config", KEYWORD, f"train.out_dir={out}", *overrides]
    code = main(cli)
    if code != 0:
        raise SystemExit(f"jaxcore {' '.join(cli)} exited {code}")


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def steps(out: Path) -> list[dict]:
    return [r for r in records(out) if "loss" in r]


def compare(a: Path, b: Path) -> dict:
    """Two runs' final weights and per-step loss, reward and grad_norm: equal bit for bit, or where they differ."""
    import numpy as np

    from jaxcore.hf.convert import read_safetensors

    pa, pb = read_safetensors(a / "final_hf"), read_safetensors(b / "final_hf")
    differing = [k for k in pa if not np.array_equal(pa[k], pb[k])]
    keys = ("step", "loss", "reward", "grad_norm")
    ra, rb = ([[r[k] for k in keys] for r in steps(x)] for x in (a, b))
    return {"weights_equal": not differing, "weights_differing": differing[:5], "tensors": len(pa),
            "logs_equal": ra == rb, "losses": [r[1] for r in ra], "other_losses": [r[1] for r in rb]}


def lag0(out: Path) -> dict:
    grpo(out / "async", *SMALL, "train.epochs=3", "grpo.asynchronous.max_staleness=0")
    grpo(out / "sync", *SMALL, "train.epochs=3", four=True)        # the synchronous run on the same training devices
    got = compare(out / "sync", out / "async")
    got["async_ratio"] = [r["ratio"] for r in steps(out / "async")]
    return {"check": "lag0", **got}


def resume(out: Path) -> dict:
    common = [*SMALL, "train.checkpoint_every=1", "grpo.asynchronous.max_staleness=1",
              "grpo.asynchronous.weight_sync_steps=2"]
    grpo(out / "straight", *common, "train.epochs=6")
    grpo(out / "resumed", *common, "train.epochs=3")
    grpo(out / "resumed", *common, "train.epochs=6", resume=True)
    got = compare(out / "straight", out / "resumed")
    rows = steps(out / "straight")
    got.update({"staleness": [r["sample/staleness_max"] for r in rows],
                "weight_syncs": [r["async/weight_syncs"] for r in rows],
                "weight_transfers": [r["async/weight_transfers"] for r in rows]})
    return {"check": "resume", **got}


def keyword(out: Path, mode: str) -> dict:
    overrides = ["train.progress=false", "train.tensorboard=false", "train.checkpoint_every=-1",
                 "train.export_hf=false", "train.eval_every=10"]
    if mode == "async":
        overrides.append("grpo.asynchronous.max_staleness=1")
    grpo(out / mode, *overrides, four=mode == "sync")
    rows = records(out / mode)
    held_out = [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
    trained = steps(out / mode)
    return {"check": f"keyword_{mode}", "held_out": held_out, "steps": len(trained),
            "train_reward": [round(r["reward"], 3) for r in trained],
            "run_time_s": round(trained[-1].get("run_time", float("nan")), 1), "load_average": os.getloadavg()}


def overlap(out: Path, *extra: str) -> dict:
    """examples/keyword's job asynchronously with one version of slack (max_staleness 2) and 8 new tokens, so that
    a batch generates in about the time a step trains, 24 steps as the suite runs (the last batches train with
    nothing left to generate: over 12 steps that tail is a sixth of the window), held-out evaluation off (it pauses
    the trainer): the timeline's overlap and each side's busy share (`jaxcore bench --suite async`'s figures)."""
    from jaxcore.bench.async_overlap import async_figures

    grpo(out / "overlap", "train.progress=false", "train.tensorboard=false", "train.checkpoint_every=-1",
         "train.export_hf=false", "train.eval_every=-1", "train.epochs=24", "rollout.max_new_tokens=8",
         "grpo.asynchronous.max_staleness=2", *extra)
    got = async_figures(steps(out / "overlap"))
    lanes = got.pop("timeline")
    return {"check": "overlap", **got, "generate_s": [round(b - a, 2) for a, b in lanes["generation"]],
            "train_s": [round(b - a, 2) for a, b in lanes["training"]]}


def main() -> None:
    # ASYNC_CHECKS_DEVICES=4: 2 generating and 2 training where 4 + 4 copies of the weights do not fit in memory
    devices = os.environ.get("ASYNC_CHECKS_DEVICES", "8")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    check, out = sys.argv[1], Path(sys.argv[2])
    if check == "one":
        return one(out, sys.argv[3:])
    if check == "keyword":
        got = keyword(out, sys.argv[3])
    elif check == "overlap":
        got = overlap(out, *sys.argv[3:])
    else:
        got = {"lag0": lag0, "resume": resume}[check](out)
    print(json.dumps({**got, "load_average": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
