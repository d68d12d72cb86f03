"""Training checkpoints: an orbax CheckpointManager around the whole train state.

Each step directory holds `state` (params, optimizer state, RNG: any pytree of arrays) and `meta`
(JSON: epoch, data position, config, package versions). Saves are asynchronous and atomic (orbax
writes to a temporary directory and renames it when complete); `max_to_keep` old steps are kept.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from jaxcore.errors import CheckpointWriteError, NoRestorableCheckpointError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

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
        try:
            self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             meta=ocp.args.JsonSave(meta)), force=True)
        except OSError as err:
            raise self._write_error(step, err) from err
        if wait:
            self.wait()

    def _write_error(self, step: int | None, err: BaseException) -> CheckpointWriteError:
        last = self.latest_step()
        where = f"step {step}" if step is not None else "a pending save"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return CheckpointWriteError(f"writing checkpoint {where} to {self.directory} failed ({reason}); "
                                    f"last good checkpoint: {'none' if last is None else f'step {last}'}")

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

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON metadata of `step` alone (no arrays are read)."""
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = restored["meta"]
        if not isinstance(meta, dict) or "epoch" not in meta:
            raise ValueError("metadata has no epoch")
        return dict(meta)

    def restore_newest(self, target: Any, check_meta: Callable[[dict[str, Any]], None] = lambda meta: None
                       ) -> tuple[Any, dict[str, Any]]:
        """Restore the newest step that restores; each one that fails is logged in one line and moved aside.

        `check_meta(meta)` may raise to refuse a readable checkpoint (e.g. config drift): that error
        propagates and nothing is moved. Raises `NoRestorableCheckpointError` when no step restores.
        """
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise NoRestorableCheckpointError(f"{self.directory}: no checkpoint to resume from")
        for step in steps:
            try:
                meta = self.read_meta(step)
            except Exception as err:  # noqa: BLE001 -- any failure to read means this step is unusable
                self._set_aside(step, f"unreadable metadata: {type(err).__name__}: {first_line(err)}")
                continue
            check_meta(meta)
            try:
                return self.restore(target, step)[0], meta
            except Exception as err:  # noqa: BLE001
                self._set_aside(step, f"arrays do not restore: {type(err).__name__}: {first_line(err)}")
        raise NoRestorableCheckpointError(f"{self.directory}: none of the checkpoints {steps} restores "
                                          f"(moved aside to {self.corrupt_dir})")

    @property
    def corrupt_dir(self) -> Path:
        """Where unrestorable steps are moved (outside the manager's directory, so it never sees them)."""
        return self.directory.parent / f"{self.directory.name}-corrupt"

    def _set_aside(self, step: int, reason: str) -> None:
        self.corrupt_dir.mkdir(parents=True, exist_ok=True)
        dest = self.corrupt_dir / f"{step}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        os.replace(self.directory / str(step), dest)
        self._manager.reload()
        log.warning("checkpoint step %d does not restore (%s); moved to %s, trying an older one",
                    step, reason[:200], dest)

    def wait(self) -> None:
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 -- async save errors surface here
            raise self._write_error(None, err) from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
