"""Guards around a training run's out_dir: config drift on resume, and one run per out_dir (a lock file).

Drift: a checkpoint's saved config is compared with the current one. Keys in `HARMLESS_KEYS` (or under a
harmless prefix) may change and are logged; any other change could alter the math, the noise stream or
the data stream, so it is refused with one line naming the key unless the user allows changes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from jaxcore.errors import OutDirLockedError, ResumeError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

HARMLESS_PREFIXES = ("train.epochs", "train.out_dir", "train.eval_every", "train.eval_prompts", "train.eval_batch_size",
                     "train.checkpoint_every", "train.max_to_keep", "train.max_bad_steps", "train.export_hf",
                     "train.tensorboard", "train.progress", "rewards.", "model.path", "model.remat", "distributed.",
                     "mesh.")          # a mesh shape (or device count) change reshards the checkpoint; math unchanged


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def is_harmless(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in HARMLESS_PREFIXES)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(incompatible, harmless) descriptions of `key: saved -> current` for every changed config key."""
    old, new = flatten(saved), flatten(current)
    incompatible, harmless = [], []
    for key in sorted(set(old) | set(new)):
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            change = f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
            new_key = key not in old           # a key added to the schema since the checkpoint was written
            (harmless if is_harmless(key) or new_key else incompatible).append(change)
    return incompatible, harmless


def check_resume_compatible(meta: dict[str, Any], config: dict[str, Any], algorithm: str,
                            shapes: dict[str, list[int]], allow_changes: bool) -> None:
    """Raise `ResumeError` naming the first incompatible difference (unless `allow_changes`); log the rest."""
    problems: list[str] = []
    saved_algorithm = meta.get("algorithm")
    if saved_algorithm is not None and saved_algorithm != algorithm:
        problems.append(f"algorithm: {saved_algorithm!r} -> {algorithm!r}")
    saved_shapes = meta.get("shapes")
    if saved_shapes is not None and saved_shapes != shapes:
        key = next((k for k in sorted(set(saved_shapes) | set(shapes)) if saved_shapes.get(k) != shapes.get(k)), "?")
        problems.append(f"model parameter {key}: shape {saved_shapes.get(key)} -> {shapes.get(key)}")
    incompatible, harmless = config_changes(meta.get("config", {}), config)
    problems += incompatible
    for change in harmless:
        log.info("resume: config changed (harmless) %s", change)
    if problems and not allow_changes:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ResumeError(f"checkpoint was written with a different {problems[0]}{more}; "
                          "pass --resume-allow-changes to resume anyway")
    for change in problems:
        log.warning("resume: config changed (allowed by --resume-allow-changes) %s", change)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutDirLock:
    """`out_dir/.lock` holding {"pid", "host"}; a stale lock (dead pid, same host) is taken over."""

    def __init__(self, out_dir: str | os.PathLike, name: str = ".lock"):
        self.path = Path(out_dir) / name
        self.held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._check_stale(me)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise OutDirLockedError(f"{self.path}: could not take the lock")

    def _check_stale(self, me: dict[str, Any]) -> None:
        """Remove the lock when its owner is dead on this host; otherwise refuse."""
        try:
            owner = json.loads(self.path.read_text())
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            owner, pid, host = None, -1, me["host"]
        if host == me["host"] and (pid == -1 or not pid_alive(pid)):
            log.warning("taking over stale lock %s (owner %s is not running)", self.path, owner)
            self.path.unlink(missing_ok=True)
            return
        raise OutDirLockedError(f"{self.path.parent} is in use by another run (pid {pid} on {host}); "
                                f"wait for it or remove {self.path} if it is gone")

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                self.path.unlink()
            except OSError as err:
                if err.errno != errno.ENOENT:
                    log.warning("could not remove %s: %s", self.path, err)

    def __enter__(self) -> OutDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
