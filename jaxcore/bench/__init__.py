"""Benchmarks: every number is a ratio against a reference measured in the same run.

Each suite is a module `jaxcore.bench.<suite>` with `run(options: BenchOptions) -> dict[str, Any]`
returning flat keys such as `"generate.jax_over_hf"`, plus descriptive entries (shapes, device).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from typing import Any

SUITES = ("generate", "es", "grpo", "rft")


@dataclasses.dataclass
class BenchOptions:
    preset: str = "bench"            # tiny checkpoint preset (jaxcore.tiny.PRESETS)
    family: str = "llama"
    dtype: str = "float32"           # jaxcore compute dtype ("bfloat16" on GPU)
    quick: bool = False              # smaller shapes, for tests
    workdir: str = "runs/bench"


def device_info() -> dict[str, Any]:
    """The machine the numbers were taken on."""
    import jax

    dev = jax.devices()[0]
    return {"device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}", "num_devices": jax.device_count(),
            "host": platform.node(), "cpu": platform.processor() or platform.machine()}


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
