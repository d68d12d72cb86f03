"""Training checkpoints: an orbax CheckpointManager around the whole train state.

Each step directory holds `state` (params, optimizer state, RNG: any pytree of arrays) and `meta`
(JSON: epoch, data position, config, package versions). Saves are asynchronous and atomic (orbax
writes to a temporary directory and renames it when complete); `max_to_keep` old steps are kept.

A save that fails (a full disk, synchronously or in orbax's background write) raises one
`CheckpointWriteError` naming the step and the last good one; orbax deletes old steps only after a
save commits, so the last good checkpoint stays. orbax's own multi-line error logs of such a failure
are demoted to DEBUG: the error itself is what gets reported.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxcore.errors import (  # noqa: F401  (CheckpointWriteError, NoRestorableCheckpointError: re-exported)
    CheckpointReadError,
    CheckpointWriteError,
    ConfigValueError,
    NoRestorableCheckpointError,
)
from jaxcore.outputs import demote_orbax_errors, os_reason

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

    def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = 3, async_save: bool = True):
        if max_to_keep is not None and not max_to_keep >= 1:     # 0 would delete every checkpoint, old ones too
            raise ConfigValueError(f"train.max_to_keep={max_to_keep}: keep at least 1 checkpoint")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._pending: int | None = None         # the step whose asynchronous write may still be running
        self._reader: Any = None                  # reads without orbax's barrier (multi-process runs; `_read`)
        demote_orbax_errors()

    def save(self, step: int, state: Any, meta: dict[str, Any], *, wait: bool = False) -> None:
        """Start writing step `step` (asynchronous unless `wait`).

        Any failure, of this save or of the previous asynchronous one (which is waited for first), raises
        `CheckpointWriteError` naming the failed step and the last good checkpoint, which is left intact.
        """
        self.wait()
        meta = {**meta, "versions": package_versions()}
        self._pending = step
        try:
            self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             meta=ocp.args.JsonSave(meta)), force=True)
        except Exception as err:  # noqa: BLE001 -- a full disk, a permission error, an orbax error: one line
            self._pending = None
            raise self._write_error(step, err) from err
        if wait:
            self.wait()

    def _write_error(self, step: int | None, err: BaseException) -> CheckpointWriteError:
        try:
            self._manager.reload()               # forget the failed step: only committed ones count
            last = self.latest_step()
            last_text = "none" if last is None else f"step {last}"
        except Exception:  # noqa: BLE001 -- the write error is the one to report
            last_text = "unknown"
        where = f"step {step}" if step is not None else "a pending save"
        reason = os_reason(err)
        return CheckpointWriteError(f"writing checkpoint {where} to {self.directory} failed ({reason}); "
                                    f"last good checkpoint: {last_text}")

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore into the structure (and shardings) of `target`; the latest step by default."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to resume from")
        restored = self._read(step, ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                       meta=ocp.args.JsonRestore()))
        check_same_tree(target, restored["state"])
        return restored["state"], dict(restored["meta"])

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON metadata of `step` alone (no arrays are read)."""
        meta = self._read(step, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict) or "epoch" not in meta:
            raise ValueError("metadata has no epoch")
        return dict(meta)

    def _read(self, step: int, args: Any) -> Any:
        """Read `step`. In a multi-process run each process reads alone, without orbax's restore barrier: a
        process whose read fails must not leave the others waiting in it (they agree in `restore_newest`)."""
        if jax.process_count() == 1:
            return self._manager.restore(step, args=args)
        if self._reader is None:
            alone = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                       active_processes={jax.process_index()})
            self._reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler(), multiprocessing_options=alone)
        return self._reader.restore(self.directory / str(step), args=args)

    def restore_newest(self, target: Any, check_meta: Callable[[dict[str, Any]], None] = lambda meta: None
                       ) -> tuple[Any, dict[str, Any]]:
        """Restore the newest step that restores; each one that is corrupt is moved aside (never deleted).

        Only a failure that proves corruption (unreadable metadata, missing or truncated array files, another
        tree or shape: `proves_corruption`) sets a step aside; any other (out of memory, an I/O or permission
        error) stops with a one-line `CheckpointReadError` and moves nothing. When an older step restores, each
        step set aside is logged in one line. When none restores, one `NoRestorableCheckpointError` line names
        every step and its reason. `check_meta(meta)` may raise to refuse a readable checkpoint (e.g. config
        drift): that error propagates and nothing is moved.

        In a multi-process run every process tries each step, the processes exchange their outcomes and act
        alike (`agree`): all stop when any failed for a reason that proves nothing (or refused the step), all
        skip a step that any proves corrupt (process 0 alone moves it), so all resume from the same step.
        """
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise NoRestorableCheckpointError(f"{self.directory}: no checkpoint to resume from")
        set_aside: list[tuple[int, str, Path]] = []
        for step in steps:
            outcome, reason, error, restored = self._try_step(step, target, check_meta)
            outcomes = _exchange(outcome, reason)
            action, who = agree([o for o, _ in outcomes])
            if action == "stop":
                stop = self._stop_error(step, outcome, error, who, outcomes[who])
                if stop is error:
                    raise stop
                raise stop from error
            if action == "skip":
                by = f"process {who}: " if len(outcomes) > 1 else ""
                set_aside.append(self._set_aside(step, by + outcomes[who][1]))
                continue
            state, meta = restored
            for bad, why, dest in set_aside:
                log.warning("checkpoint step %d does not restore (%s); moved to %s; resuming from step %d",
                            bad, why[:200], dest, step)
            return state, meta
        reasons = "; ".join(f"step {bad}: {why[:120]}" for bad, why, _ in set_aside)
        raise NoRestorableCheckpointError(f"{self.directory}: none of the checkpoints {steps} restores ({reasons}); "
                                          f"moved aside to {self.corrupt_dir}")

    def _try_step(self, step: int, target: Any, check_meta: Callable[[dict[str, Any]], None]
                  ) -> tuple[int, str, BaseException | None, tuple[Any, dict[str, Any]] | None]:
        """This process's attempt at `step`: (outcome, reason, error, (state, meta) when restored)."""
        try:
            meta = self.read_meta(step)
        except Exception as err:  # noqa: BLE001 -- classified: corrupt steps are set aside, others stop
            return (*_classify("unreadable metadata", err), err, None)
        try:
            check_meta(meta)
        except Exception as err:  # noqa: BLE001 -- refused: raised again once the processes agree
            return REFUSED, first_line(err), err, None
        try:
            state = self.restore(target, step)[0]
        except Exception as err:  # noqa: BLE001
            return (*_classify("arrays do not restore", err), err, None)
        return RESTORED, "", None, (state, meta)

    def _stop_error(self, step: int, outcome: int, error: BaseException | None, who: int,
                    deciding: tuple[int, str]) -> BaseException:
        """The error every process stops with: the refusal itself where this process refused the step, else one
        `CheckpointReadError` line (the same on every process) naming the failure of process `who`."""
        if outcome == REFUSED and error is not None:
            return error
        kind, why = deciding
        by = f" by process {who}" if jax.process_count() > 1 else ""
        if kind == REFUSED:
            return CheckpointReadError(f"checkpoint step {step} in {self.directory} was refused{by} ({why}); "
                                       "nothing was moved")
        return CheckpointReadError(f"checkpoint step {step} in {self.directory} could not be read{by} ({why}); "
                                   "nothing was moved: fix the cause and resume again")

    @property
    def corrupt_dir(self) -> Path:
        """Where unrestorable steps are moved (outside the manager's directory, so it never sees them)."""
        return self.directory.parent / f"{self.directory.name}-corrupt"

    def _set_aside(self, step: int, reason: str) -> tuple[int, str, Path]:
        """Move `step` to `corrupt_dir` (renamed, never deleted; by process 0 alone in a multi-process run, the
        others wait for it), then every process reloads the step list; returns (step, reason, where it went)."""
        if jax.process_index() != 0:
            log.debug("checkpoint step %d does not restore (%s); process 0 moves it", step, reason)
            dest = self.corrupt_dir
        else:
            stamp = time.strftime("%Y%m%dT%H%M%S")
            self.corrupt_dir.mkdir(parents=True, exist_ok=True)
            dest = self.corrupt_dir / f"{step}.corrupt-{stamp}"
            suffix = 1
            while dest.exists():
                dest = self.corrupt_dir / f"{step}.corrupt-{stamp}-{suffix}"
                suffix += 1
            os.replace(self.directory / str(step), dest)
            log.debug("set aside checkpoint step %d (%s) to %s", step, reason, dest)
        _barrier(f"jaxcore: checkpoint step {step} set aside")
        self._manager.reload()
        return step, reason, dest

    def wait(self) -> None:
        """Wait for the pending asynchronous save; its failure (raised by orbax's finalize) is one line."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 -- async save errors surface here
            raise self._write_error(step, err) from err

    def close(self) -> None:
        """Wait for the pending save and release orbax's threads; a failed save is raised after closing."""
        error: CheckpointWriteError | None = None
        try:
            self.wait()
        except CheckpointWriteError as err:
            error = err
        try:
            self._manager.close()
        except Exception as err:  # noqa: BLE001
            if error is None:
                error = self._write_error(None, err)
        if self._reader is not None:
            self._reader, reader = None, self._reader
            reader.close()
        if error is not None:
            raise error


def check_same_tree(target: Any, restored: Any) -> None:
    """Raise ValueError naming the first array whose shape differs from the target's, or a tree that differs
    (orbax refuses such mismatches itself; this keeps a wrong tree from ever being restored quietly).
    Dtypes are not compared: orbax casts to the target's dtype."""
    import jax
    import numpy as np

    want = dict(jax.tree_util.tree_flatten_with_path(target)[0])
    got = dict(jax.tree_util.tree_flatten_with_path(restored)[0])
    if want.keys() != got.keys():
        missing = sorted(map(jax.tree_util.keystr, want.keys() - got.keys()))
        extra = sorted(map(jax.tree_util.keystr, got.keys() - want.keys()))
        raise ValueError(f"checkpoint tree differs: missing {missing[:3]}, unexpected {extra[:3]}")
    for path, leaf in want.items():
        if np.shape(leaf) != np.shape(got[path]):
            raise ValueError(f"{jax.tree_util.keystr(path)}: stored shape {list(np.shape(got[path]))}, "
                             f"expected {list(np.shape(leaf))}")


# One process's outcome for one step in `restore_newest`, exchanged with the other processes.
RESTORED, CORRUPT, REFUSED, FAILED = 0, 1, 2, 3
_REASON_BYTES = 256       # how much of a reason travels to the other processes (UTF-8)


def agree(outcomes: Sequence[int]) -> tuple[str, int | None]:
    """What every process does with a step, given each process's outcome in process order: ("stop", i) when
    process i failed for a reason that proves nothing or refused the step (nothing is moved); else ("skip", i)
    when process i proves it corrupt (process 0 moves it aside, all try the next older step); else
    ("restore", None). i is the lowest such process."""
    for action, kinds in (("stop", (FAILED, REFUSED)), ("skip", (CORRUPT,))):
        for index, outcome in enumerate(outcomes):
            if outcome in kinds:
                return action, index
    return "restore", None


def _classify(what: str, err: BaseException) -> tuple[int, str]:
    """(CORRUPT, reason the step is set aside) when `err` proves corruption, else (FAILED, the error)."""
    err = _unwrapped(err)
    if proves_corruption(err):
        return CORRUPT, f"{what}: {type(err).__name__}: {first_line(err)}"
    return FAILED, f"{type(err).__name__}: {first_line(err)[:200]}"


def _exchange(outcome: int, reason: str) -> list[tuple[int, str]]:
    """Every process's (outcome, reason) for one step, in process order (an all-gather); in a single-process run
    this process's alone, without any communication."""
    if jax.process_count() == 1:
        return [(outcome, reason)]
    from jax.experimental import multihost_utils

    text = reason.encode()[:_REASON_BYTES]
    row = np.zeros(1 + _REASON_BYTES, np.int32)
    row[0], row[1:1 + len(text)] = outcome, np.frombuffer(text, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(row)).reshape(jax.process_count(), -1)
    return [(int(r[0]), bytes(r[1:].astype(np.uint8)).rstrip(b"\0").decode(errors="ignore")) for r in rows]


def _barrier(name: str) -> None:
    """Wait until every process gets here (nothing to wait for in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


# tensorstore/absl status codes that say the storage could not be reached now, not that the data is bad
_TRANSIENT_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED",
                    "PERMISSION_DENIED", "UNAUTHENTICATED", "INTERNAL", "UNKNOWN")


def _unwrapped(err: BaseException) -> BaseException:
    """The error under orbax's wrappers: orbax raises a bare `Exception` ("Encountered error while reading array
    index ...") from tensorstore's error when one chunk of an array does not read."""
    while type(err) is Exception and err.__cause__ is not None:
        err = err.__cause__
    return err


def proves_corruption(err: BaseException) -> bool:
    """Whether a failure to read a checkpoint proves it corrupt: unreadable or missing metadata, missing or
    truncated array files, a chunk that does not decode, another tree or shape. Memory, I/O and permission
    errors (and anything unknown) do not: the same checkpoint may read fine once the cause is fixed. orbax's
    bare `Exception` wrapper is judged by the error it wraps."""
    err = _unwrapped(err)
    if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError, KeyError, FileNotFoundError, NotADirectoryError,
                        IsADirectoryError)):
        return True
    if isinstance(err, (OSError, MemoryError, RuntimeError)):        # EIO, ENOSPC, EACCES; XLA's out of memory
        return False
    if isinstance(err, ValueError):           # tensorstore's status errors, orbax's and our tree/shape checks
        code = re.match(r"([A-Z_]+): ", str(err))
        return not (code and code.group(1) in _TRANSIENT_CODES)
    return False
