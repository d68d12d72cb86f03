"""JAX's persistent compilation cache: compiled programs written to a directory and loaded by later processes, so a
rerun or a resumed run does not compile its programs again (a GRPO train step at 135M takes minutes on a CPU).

One setting, `train.compilation_cache` (a directory, or "off"), set by `--compilation-cache` on the command line;
the environment variable `JAXCORE_COMPILATION_CACHE` (a directory, or "off") overrides it (CI, tests). The default,
`~/.cache/jaxcore/xla`, is used unless JAX already has a cache directory of its own (`JAX_COMPILATION_CACHE_DIR`).
JAX keys every entry by the program, the jax/jaxlib version, the backend and its flags, and XLA:CPU refuses an
entry compiled for other CPU features (it compiles again), so one directory can serve every run of a user.

    enable(cfg.train.compilation_cache)      # before the run compiles; later calls switch the directory
    stats()                                  # {"dir", "entries_before", "warm", "hits", "misses", "written"}
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import jax

from jaxcore.runtime.programs import ledger

log = logging.getLogger(__name__)

DEFAULT_DIR = "~/.cache/jaxcore/xla"
ENV = "JAXCORE_COMPILATION_CACHE"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"      # a user's own setting wins
OFF = ("off", "none", "false", "0", "")
_state: dict[str, Any] = {"dir": None, "entries_before": 0, "since": 0.0}


def resolve(setting: str | None) -> str | None:
    """The cache directory a run uses (None: off): `JAXCORE_COMPILATION_CACHE` if set, else `setting`; the default
    directory gives way to a directory JAX was already given."""
    chosen = os.environ.get(ENV, setting if setting is not None else DEFAULT_DIR)
    if chosen.strip().lower() in OFF:
        return None
    if chosen == DEFAULT_DIR and jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    return str(Path(chosen).expanduser())


def entries(directory: str | None) -> int:
    """Cache entries in `directory` (0 when it does not exist)."""
    path = Path(directory) if directory else None
    return sum(1 for p in path.iterdir() if p.name.endswith("-cache")) if path and path.is_dir() else 0


def enable(setting: str | None) -> str | None:
    """Use the cache directory `resolve(setting)` (or none) from the next compilation on, counting its hits and
    misses from here; returns the directory."""
    directory = resolve(setting)
    if directory != jax.config.jax_compilation_cache_dir:
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", directory)
        compilation_cache.reset_cache()       # JAX decides once per process whether to use a cache: decide again
    if directory and MIN_COMPILE_TIME_ENV not in os.environ:
        # JAX keeps only programs that took a second to compile; a run's dozens of small ones then cost it
        # again in every process. Every program is kept (a later run of the same config compiles nothing).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    ledger()                                  # counts the cache's hits and misses from here on
    _state.update(dir=directory, entries_before=entries(directory), since=time.time())
    if directory:
        log.info("compilation cache %s (%d entries)", directory, _state["entries_before"])
        if not _writable(Path(directory)):
            log.warning("compilation cache %s cannot be written: this run's programs are compiled and not kept",
                        directory)
    return directory


def _writable(directory: Path) -> bool:
    """Whether entries can be written in `directory` (or it can be made, in its nearest existing parent)."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


def stats() -> dict[str, Any]:
    """The cache in use since `enable`: its directory (None: off), the entries it held then (`warm`: any), the
    compilations since loaded from it (hits) or compiled and offered to it (misses), and the entries it holds now
    that it did not then (written: a directory that cannot be written keeps none of the misses)."""
    made = ledger().totals(since=_state["since"]) if _state["dir"] else None
    written = max(entries(_state["dir"]) - _state["entries_before"], 0) if _state["dir"] else 0
    return {"dir": _state["dir"], "entries_before": _state["entries_before"], "warm": _state["entries_before"] > 0,
            "hits": made.hits if made else 0, "misses": made.misses if made else 0, "written": written}


def log_stats() -> None:
    """One log line: the programs this run loaded from the cache and those it wrote there (found in the directory,
    not assumed from the compilations: a read-only cache writes none)."""
    s = stats()
    if s["dir"]:
        unkept = f" ({s['misses'] - s['written']} compiled programs could not be written)" \
            if s["misses"] > s["written"] else ""
        log.info("compilation cache %s: %d programs loaded, %d written%s", s["dir"], s["hits"], s["written"], unkept)
