"""Shared pytest setup: 8 simulated CPU devices, offline HF, and tiny local checkpoints."""

import os
import sys

# Must happen before JAX initialises anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["JAXCORE_COMPILATION_CACHE"] = "off"    # never the user's cache; tests that use one give a tmp dir

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3", "gpt2")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    """tiny_dir(family, **options) -> path of a cached tiny HF checkpoint."""
    from jaxcore.hf.tiny import write_tiny_checkpoint

    cache: dict[tuple, Path] = {}

    def make(family: str = "llama", **options) -> Path:
        key = (family, tuple(sorted(options.items())))
        if key not in cache:
            name = "-".join([family, *(f"{k}={v}" for k, v in sorted(options.items()))])
            cache[key] = write_tiny_checkpoint(tmp_path_factory.mktemp(name), family, **options)
        return cache[key]

    return make


MAP_BUDGET = 20_000    # of the kernel's vm.max_map_count (65530 by default): each XLA CPU executable maps its code


def _mapped_regions() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:    # no procfs: nothing to watch
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Drop JAX's compiled programs once a worker maps too much, so a long xdist worker never hits the map limit.

    Each compiled CPU program keeps its machine code mapped until its cache entry goes; a worker that runs a
    thousand tests otherwise fails in whatever test comes next ("Failed to materialize symbols", mmap ENOMEM).
    """
    yield
    if "jax" in sys.modules and _mapped_regions() > MAP_BUDGET:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
