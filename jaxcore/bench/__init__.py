"""Benchmarks: every number is a ratio against a reference measured in the same run.

Each suite is a module `jaxcore.bench.<suite>` with `run(options: BenchOptions) -> dict[str, Any]`
returning flat keys such as `"generate.jax_over_hf"`, plus descriptive entries (shapes, device).

An application of the library: may import `jaxcore.api` and everything below it, and `torchref` (the
references it measures against).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class BenchOptions:
    preset: str = "bench"            # tiny checkpoint preset (jaxcore.hf.tiny.PRESETS)
    family: str = "llama"
    dtype: str = "float32"           # jaxcore compute dtype (`jaxcore bench` defaults to bfloat16 on GPU)
    quick: bool = False              # smaller shapes, for tests
    workdir: str = "runs/bench"
    compilation_cache: str | None = None   # the trl suite's jaxcore runs: a directory, "off", None = the default
    steps: int | None = None         # the trl suite: steps per run in every regime (None: its defaults)
    conversational: bool = False     # the trl suite: prompts as chat messages (the tokenizer's chat template)
    target: str = "h100"             # the gpu-compile suite: the GPU compiled for (`gpu_targets.TARGETS`)
    devices: int = 8                 # the gpu-compile suite: GPUs in its topology
    budget_s: float | None = None    # the learn suite: training seconds per method and seed (None: its default)
    seeds: tuple[int, ...] | None = None      # the learn suite: seeds per method (None: its default)
    methods: tuple[str, ...] | None = None    # the learn suite: methods to run (None: all)
    eval_every_s: float | None = None         # the learn suite: seconds of training between evaluations
    png: str | None = None           # the learn suite: where its curves go (None: under workdir)
    max_staleness: tuple[int, ...] | None = None   # the async suite: one asynchronous run per value (None: 2)
    weight_sync_steps: int | None = None      # the async suite: weight_sync_steps of its runs (None: 1)


# Shapes for the real-size presets (issue 12): batch/population 256, prompt 64, 256 new tokens.
REAL_SHAPES = {"batch": 256, "prompt_len": 64, "new_tokens": 256}


def is_real_size(options: BenchOptions) -> bool:
    """True for the real model shapes (everything but the small CPU models)."""
    return not options.quick and options.preset not in ("tiny", "bench")


def roofline_entry(model: Any, options: BenchOptions, measured_s: float, *, batch: int, prompt_len: int,
                   new_tokens: int, factor_targets: Any = (), rank: int = 1, decode_only: bool = False
                   ) -> dict[str, Any]:
    """Roofline of one generation call against this run's measured peaks: the prefill and every decode
    step as separate phases (`decode_only`: the decode steps alone, for a time that excludes the prefill)."""
    import jax.numpy as jnp

    from jaxcore.bench import roofline

    peaks = roofline.peaks_for(options.dtype, options.quick)
    build = roofline.decode_phases if decode_only else roofline.generation
    phases = build(roofline.model_shape(model), batch, prompt_len, new_tokens, jnp.dtype(options.dtype).itemsize,
                   factor_targets=factor_targets, rank=rank)
    return roofline.limit(phases, peaks, measured_s)


def device_info() -> dict[str, Any]:
    """The machine and software the numbers were taken on: device, CPU model and cores, library versions,
    thread settings and XLA flags, so that two JSON files can be compared (or not) knowingly."""
    import os

    import jax

    from jaxcore.runtime import host_allocator

    dev = jax.devices()[0]
    env_keys = ("XLA_FLAGS", host_allocator.ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "OPENBLAS_CORETYPE", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    return {"device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}", "num_devices": jax.device_count(),
            "host": platform.node(), "cpu": cpu_model(), "cpu_cores": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "versions": library_versions(), "torch_threads": torch_threads(),
            "host_malloc": host_allocator.policy(),        # jaxcore.runtime.host_allocator
            "env": {k: os.environ[k] for k in env_keys if k in os.environ}}


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo's `model name`), else what `platform` knows."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a figure depends on (absent ones are left out)."""
    from importlib import metadata

    versions = {}
    for name in ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "trl", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def torch_threads() -> int | None:
    """torch's intra-op thread count when torch is already imported (None otherwise: importing it costs)."""
    import sys

    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def best_time(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> float:
    """Minimum wall time of `fn()` over `repeats` runs after `warmup` runs (fn must block)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_best_times(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best time of each fn over `rounds`, alternating them round by round after one untimed warmup call
    each (compilation), so that load from other processes on a shared machine hits every side alike."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_time(fn, repeats=1, warmup=0))
    return best


def bench_checkpoint(options: BenchOptions, family: str | None = None) -> Any:
    """The documented bench model (written once under options.workdir; `quick` uses the tiny preset)."""
    from pathlib import Path

    from jaxcore.hf.tiny import PRESET_FAMILY, write_tiny_checkpoint

    if options.preset == "smollm2-135m-instruct":          # the real model, where it is installed
        real = Path("models/smollm2-135m-instruct")
        if not (real / "config.json").is_file():
            raise FileNotFoundError(f"{real} is not installed; use --preset smollm2-135m (random weights)")
        return real
    preset = "tiny" if options.quick else options.preset
    family = family or PRESET_FAMILY.get(preset, options.family)
    path = Path(options.workdir) / f"model-{family}-{preset}"
    if not (path / "config.json").is_file():
        write_tiny_checkpoint(path, family, preset=preset)
    return path


def model_summary(model: Any) -> dict[str, Any]:
    """Shape of a jaxcore model, for the bench report."""
    from jaxcore.model.state import flat_state

    cfg = model.config
    params = sum(int(v.size) for v in flat_state(model).values())
    return {"family": cfg.family, "params_m": round(params / 1e6, 2), "layers": cfg.num_layers,
            "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "dtype": str(model.dtype)}


def compiled_bytes(jitted: Any, *args: Any, **kwargs: Any) -> int:
    """Peak device memory XLA plans for one call: arguments + outputs + temporaries - aliased."""
    return peak_bytes(jitted.lower(*args, **kwargs).compile().memory_analysis())


def peak_bytes(stats: Any) -> int:
    """A compiled program's per-device peak from its `memory_analysis()`: arguments + outputs + temporaries -
    aliased."""
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
