"""Host memory that stays mapped between XLA:CPU programs.

XLA:CPU allocates every buffer of a program run (a GRPO step's temporaries are one block of gigabytes) from the
thread that runs it. glibc serves such a request from that thread's own arena, which cannot hold it, so it maps
fresh pages and unmaps them when the run ends: every step page-faults its whole working set anew (seconds of
kernel time per step on a small host; docs/benchmarks.md). With one arena, no mmap'd chunks and no trimming,
freed blocks stay in the heap and the next step reuses them: no faults after the first step.

`keep_freed_host_memory()` sets that policy (glibc's `mallopt`); the `jaxcore` command and the trainers
(`jaxcore.api`, `jaxcore.trl`) call it before their first JAX work, because it only reaches the threads that have
not allocated yet: XLA's CPU client starts its threads on the first JAX computation. Importing jaxcore does not.
The cost: the process keeps its peak host memory instead of returning it to the system.
Set `JAXCORE_HOST_MALLOC=system` to keep glibc's defaults. Nothing is changed where an accelerator plugin is
installed (device buffers do not live here), on other C libraries, or once a JAX backend is running.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import warnings

ENV = "JAXCORE_HOST_MALLOC"                 # "keep" (the default) or "system": leave glibc's allocator as it is
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8          # glibc's <malloc.h> parameter numbers
applied = False                             # whether this process runs with the policy (for the bench reports)
ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")


def policy() -> str:
    """What this process runs with, for reports: "kept" (the policy above) or "system" (glibc's defaults)."""
    return "kept" if applied else "system"


def accelerator_plugin_installed() -> bool:
    """Whether a JAX GPU/TPU plugin module is installed (then XLA:CPU's host buffers are not the hot path)."""
    return any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS)


def backend_running() -> bool:
    """Whether a JAX backend has started (its threads already have their arenas), without starting one."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    initialized = getattr(bridge, "backends_are_initialized", None)
    return bool(initialized and initialized())


def keep_freed_host_memory() -> bool:
    """One malloc arena, no mmap'd chunks, no trimming (see the module docstring). Returns whether it was set."""
    choice = os.environ.get(ENV, "keep")
    if choice not in ("keep", "system"):
        warnings.warn(f"{ENV}={choice!r} is neither 'keep' nor 'system'; keeping freed host memory", stacklevel=2)
    if choice == "system" or not sys.platform.startswith("linux"):
        return False
    if accelerator_plugin_installed() or backend_running():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):     # glibc only: the parameters below mean something else elsewhere
        return False
    global applied
    # M_TRIM_THRESHOLD -1 is glibc's SIZE_MAX (its value is converted to size_t): never trim the heap
    applied = all(libc.mallopt(param, value) == 1 for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
                                                                  (M_TRIM_THRESHOLD, -1)))
    return applied
