"""Compiling for a named GPU on a host that has none ("deviceless"): XLA's CUDA compiler reads the GPU's
properties from a target description (`targets/<name>.txtpb`, shipped with the package) instead of a driver.

The CUDA plugin (`jax[cuda12]` of the installed jax version) must be importable: `make gpu-compile` installs it
beside the virtualenv (`<venv>/gpu-compile`), where `ensure_plugin` finds it. Only abstract arrays are placed
on the topology's devices; concrete arrays stay on the CPU, which remains JAX's default backend.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxcore.errors import UserError

TARGETS = {
    # name: (target description, device kind for the topology, HBM bytes per second, memory bytes)
    "h100": ("h100.txtpb", "h100", 3.35e12, 80e9),
    "a100-40": ("a100-40.txtpb", "a100", 1.555e12, 40e9),
}
PLUGIN_DIR = "gpu-compile"          # beside the virtualenv's site-packages: <sys.prefix>/gpu-compile


def target_description(target: str) -> str:
    """The text `GpuTargetConfigProto` of a named GPU."""
    if target not in TARGETS:
        raise UserError(f"unknown --target {target!r}; choose from {', '.join(TARGETS)}")
    return (Path(__file__).parent / "targets" / TARGETS[target][0]).read_text()


def hbm_bandwidth(target: str) -> float:
    """The GPU's memory bandwidth in bytes per second (its target description's `memory_bandwidth`)."""
    return TARGETS[target][2]


def device_memory(target: str) -> float:
    """The GPU's memory in bytes, as sold (80 GB, 40 GB)."""
    return TARGETS[target][3]


def prepare_environment() -> None:
    """Settings the CUDA plugin needs to load without a driver; call before JAX starts its backends."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    ensure_plugin()


def ensure_plugin() -> None:
    """Make XLA's CUDA plugin importable (from `<venv>/gpu-compile` where `make gpu-compile` put it), or say
    in one line how to install it."""
    if _has_cuda_plugin():
        return
    beside = Path(sys.prefix) / PLUGIN_DIR
    if beside.is_dir() and str(beside) not in sys.path:
        sys.path.append(str(beside))              # `jax_plugins` is a namespace package: it sees the new entry
        importlib.invalidate_caches()
    if not _has_cuda_plugin():
        from importlib import metadata

        raise UserError("compiling for a GPU needs XLA's CUDA plugin: run `make gpu-compile-install` (puts it in "
                        f"{beside}) or `pip install 'jax[cuda12]=={metadata.version('jax')}'`")


def _has_cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except (ImportError, ValueError):
        return False


def topology_devices(target: str, devices: int = 1) -> Sequence[Any]:
    """`devices` abstract GPUs of the named kind (one host, NVLink-connected as an 8-GPU node is) to lower and
    compile for."""
    from jax.experimental.topologies import get_topology_desc

    description = target_description(target)
    prepare_environment()
    topology = get_topology_desc(TARGETS[target][1], "cuda", target_config=description,
                                 topology=f"1x1x{devices}")
    return list(topology.devices)[:devices]
