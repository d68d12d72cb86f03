"""Training checkpoints: an orbax CheckpointManager around the whole train state.

Each step directory holds `state` (params, optimizer state, RNG: any pytree of arrays) and `meta`
(JSON: epoch, data position, config, package versions). Saves are asynchronous and atomic (orbax
writes to a temporary directory and renames it when complete); `max_to_keep` old steps are kept.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

PACKAGES = ("jaxcore", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "torch", "numpy")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a checkpoint depends on."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


class TrainCheckpointer:
    """Save and restore (state pytree, meta dict) per step under `directory`."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state: Any, meta: dict[str, Any], *, wait: bool = False) -> None:
        """Start writing step `step` (asynchronous unless `wait`)."""
        meta = {**meta, "versions": package_versions()}
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         meta=ocp.args.JsonSave(meta)), force=True)
        if wait:
            self.wait()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore into the structure (and shardings) of `target`; the latest step by default."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to resume from")
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                                       meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
