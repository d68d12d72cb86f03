"""Guards around a training run's out_dir: config drift on resume, and one run per out_dir (a lock file).

Drift: a checkpoint's saved config is compared with the current one. Keys in `HARMLESS_KEYS` (or under a
harmless prefix) may change and are logged; any other change could alter the math, the noise stream or
the data stream, so it is refused with one line naming the key unless the user allows changes. A
different algorithm or different state shapes (another model, another optimizer) cannot be restored at
all, so they are refused even when changes are allowed (rather than every good checkpoint failing to
restore and being set aside as corrupt).

Lock: `out_dir/.lock` is published complete (written to a private file, then hard-linked into place,
which fails if a lock exists), so another run never reads a half-written lock; a lock it cannot read is
never taken for stale.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any

from jaxcore.errors import OutDirLockedError, ResumeError  # noqa: F401  (re-exported)
from jaxcore.outputs import special_kind, translated_os_errors

log = logging.getLogger(__name__)

HARMLESS_PREFIXES = ("train.out_dir", "train.eval_every", "train.eval_prompts", "train.eval_batch_size",
                     "train.eval_samples_per_prompt", "train.log_completions", "train.completions_to_print",
                     "train.checkpoint_every", "train.max_to_keep", "train.max_bad_steps", "train.export_hf",
                     "train.tensorboard", "train.progress", "train.compilation_cache", "rewards.num_workers",
                     "rewards.timeout_s", "model.remat",
                     "distributed.",
                     "mesh.")          # a mesh shape (or device count) change reshards the checkpoint; math unchanged
# Not harmless: rewards.functions/weights/fallback (the fitness itself), model.path (the reference model and,
# with LoRA, the frozen base are read from it again), and train.epochs under a decaying learning-rate schedule.
DECAYING_SCHEDULES = ("linear", "cosine")
WEIGHTS_RTOL = 1e-5
PID_MAX = 2**31 - 1                    # the largest pid_t: a lock's pid above it names no process


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
    schedule = new.get("optimizer.schedule", "constant")
    for key in sorted(set(old) | set(new)):
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            change = f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
            if key == "train.epochs" and schedule in DECAYING_SCHEDULES:
                incompatible.append(f"{change} (the {schedule} learning-rate schedule decays to 0 at the last "
                                    "epoch: a new horizon changes the rate of every later step)")
                continue
            new_key = key not in old           # a key added to the schema since the checkpoint was written
            (harmless if key == "train.epochs" or is_harmless(key) or new_key else incompatible).append(change)
    return incompatible, harmless


def weights_changes(saved: dict[str, list[float]] | None, current: dict[str, list[float]] | None) -> list[str]:
    """The parameters whose fingerprints (`jaxcore.model.state.weight_moments`) differ between the weights a run
    started from and those loaded now (empty when either is unknown)."""
    if not saved or not current:
        return []
    out = []
    for path in sorted(set(saved) | set(current)):
        a, b = saved.get(path), current.get(path)
        if a is None or b is None or any(abs(x - y) > WEIGHTS_RTOL * max(abs(x), abs(y), 1e-30) for x, y in zip(a, b)):
            out.append(path)
    return out


def structure_changes(meta: dict[str, Any], algorithm: str, shapes: dict[str, list[int]]) -> list[str]:
    """What makes a checkpoint impossible to restore into this run: another algorithm, other state shapes."""
    problems = []
    saved_algorithm = meta.get("algorithm")
    if saved_algorithm is not None and saved_algorithm != algorithm:
        problems.append(f"algorithm: {saved_algorithm!r} -> {algorithm!r}")
    saved_shapes = meta.get("shapes")
    if saved_shapes is not None and saved_shapes != shapes:
        for key in sorted(set(saved_shapes) | set(shapes)):
            old, new = saved_shapes.get(key), shapes.get(key)
            if old == new:
                continue
            what = "model parameter" if key.startswith("['params']") else "state entry"
            if old is None:
                problems.append(f"{what} {key}: not in the checkpoint (shape {new} now)")
            elif new is None:
                problems.append(f"{what} {key}: in the checkpoint (shape {old}), not in this run")
            else:
                problems.append(f"{what} {key}: shape {old} -> {new}")
            break
    return problems


def data_fingerprint(task: Any) -> str | None:
    """A digest of a dataset task's examples, train and eval (prompts, answers, columns), so that a resume over a
    changed dataset file is caught; None for a task that generates its examples (its config says it all). A
    column value JSON cannot hold counts by its type only, never by its address in memory."""
    train, held_out = getattr(task, "train", None), getattr(task, "eval", None)
    if not isinstance(train, (tuple, list)):
        return None
    digest = hashlib.sha256()
    for split in (train, held_out or ()):
        for example in split:
            row = [example.prompt, example.answer, dict(example.columns)]
            digest.update(json.dumps(row, sort_keys=True, default=lambda value: type(value).__name__).encode())
            digest.update(b"\n")
        digest.update(b"--split--")
    return digest.hexdigest()[:16]


# Settings that decide the train state's entries: a change of one is why a checkpoint's state does not fit
STATE_SHAPING = ("grpo.lora", "optimizer.name")


def state_shaping_change(saved: dict[str, Any], current: dict[str, Any]) -> tuple[str, str] | None:
    """The first `STATE_SHAPING` setting that differs between the checkpoint's config and this run's, and its change
    described (LoRA on one side only: which side trained an adapter; else the first key that differs), or None.
    Before, a LoRA run resumed without LoRA was refused naming an optimizer slot of a layer, not grpo.lora."""
    for name in STATE_SHAPING:
        section, key = name.split(".")
        old, new = (saved.get(section) or {}).get(key), (current.get(section) or {}).get(key)
        if old == new:
            continue
        if name == "grpo.lora" and (old is None) != (new is None):
            trained = ("a LoRA adapter", "every weight") if old else ("every weight", "a LoRA adapter")
            return name, f"grpo.lora {'set' if old else 'unset'} (its run trained {trained[0]}, this one {trained[1]})"
        changes = config_changes({section: {key: old}}, {section: {key: new}})[0]
        return name, f"a different {changes[0] if changes else name}"
    return None


def check_resume_compatible(meta: dict[str, Any], config: dict[str, Any], algorithm: str,
                            shapes: dict[str, list[int]], allow_changes: bool,
                            base_weights: dict[str, list[float]] | None = None, data: str | None = None) -> None:
    """Raise `ResumeError` naming the first incompatible difference; log the rest.

    A different algorithm or state shape is always refused (it cannot be restored); other incompatible
    config changes, starting weights (`base_weights`, the fingerprint of the model loaded now) and a dataset
    (`data`, `data_fingerprint`) that are not those the run started from are refused unless `allow_changes`
    (a checkpoint written before datasets were fingerprinted is not checked for its data).
    """
    structural = structure_changes(meta, algorithm, shapes)
    if structural:
        setting, cause = state_shaping_change(meta.get("config", {}), config) or ("model and algorithm", None)
        what = f"{cause} (so a different {structural[0]})" if cause else f"a different {structural[0]}"
        same = setting
        raise ResumeError(f"checkpoint was written with {what}; it cannot be restored into this run (even with "
                          f"--resume-allow-changes): use the same {same}, or another train.out_dir")
    problems, harmless = config_changes(meta.get("config", {}), config)
    changed = weights_changes(meta.get("base_weights"), base_weights)
    if changed:
        problems.append(f"model: the weights at model.path are not those the run started from ({changed[0]} "
                        f"differs{f' and {len(changed) - 1} more' if len(changed) > 1 else ''})")
    if meta.get("data") and data and meta["data"] != data:
        problems.append(f"dataset: its examples are not those the run started from (digest {meta['data']} -> "
                        f"{data})")
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
    """`out_dir/.lock` holding {"pid", "host"}; a stale lock (dead pid, same host) is taken over.

    The lock appears complete or not at all (a private file hard-linked into place; `os.link` fails when
    the name exists, like O_EXCL). A lock that cannot be read is refused, never treated as stale. Taking
    over a stale lock happens under an flock on the out_dir, after re-reading the lock, so two runs
    taking it over at once cannot remove each other's fresh lock.
    """

    def __init__(self, out_dir: str | os.PathLike, name: str = ".lock"):
        self.path = Path(out_dir) / name
        self.held = False
        self.created_dir = False             # the out_dir did not exist: removed on release if still empty

    def acquire(self) -> None:
        self.created_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(5):
            if self._publish(me):
                self.held = True
                return
            self._take_over_if_stale(me)
        raise OutDirLockedError(f"{self.path}: could not take the lock")

    def _publish(self, me: dict[str, Any]) -> bool:
        """Put a complete lock file in place unless one exists; True when it is ours."""
        private = self.path.with_name(f"{self.path.name}.{me['pid']}.{uuid.uuid4().hex}.tmp")
        try:
            with open(private, "x") as f:
                json.dump(me, f)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(private, self.path)          # atomic, and fails if the lock exists
            except FileExistsError:
                return False
            except OSError as err:                   # a filesystem without hard links: exclusive create
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                return self._publish_exclusive(me)
            return True
        finally:
            private.unlink(missing_ok=True)

    def _publish_exclusive(self, me: dict[str, Any]) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return True

    def _read_owner(self) -> tuple[str, int, str] | None:
        """(raw text, pid, host) of the current lock; None when there is none. Refuses a lock that is not a regular
        file (a named pipe would hang the read) and one that does not name its owner: a pid that is not a whole
        number a process can have (a string, Infinity, 1e30, 0 or below: os.kill would overflow, or signal a
        whole process group) or no host."""
        kind = special_kind(self.path)
        if kind is not None:
            raise OutDirLockedError(f"{self.path.parent} is locked by {self.path}, which is {kind}, not a lock file; "
                                    "remove it if no run is using this out_dir")
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            owner = json.loads(text)
            pid = owner["pid"]
            if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX):
                raise ValueError(f"pid {pid!r} is not a process id")
            return text, pid, str(owner["host"])
        except (ValueError, KeyError, TypeError) as err:
            raise OutDirLockedError(f"{self.path.parent} is locked by {self.path}, which does not name its owner "
                                    f"({text[:40]!r}); remove it if no run is using this out_dir") from err

    def _take_over_if_stale(self, me: dict[str, Any]) -> None:
        """Remove the lock when its owner is dead on this host; otherwise refuse."""
        current = self._read_owner()
        if current is None:
            return                                   # released meanwhile: try again
        _, pid, host = current
        if host != me["host"] or pid_alive(pid):
            raise OutDirLockedError(f"{self.path.parent} is in use by another run (pid {pid} on {host}); "
                                    f"wait for it or remove {self.path} if it is gone")
        with _dir_flock(self.path.parent):
            if self._read_owner() != current:
                return                               # someone else took it over first: look again
            log.warning("taking over stale lock %s (owner pid %d on %s is not running)", self.path, pid, host)
            self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                self.path.unlink()
            except OSError as err:
                if err.errno != errno.ENOENT:
                    log.warning("could not remove %s: %s", self.path, err)
            if self.created_dir:             # a run that stopped before writing anything leaves no out_dir
                try:
                    self.path.parent.rmdir()
                except OSError:
                    pass                     # not empty (or gone): keep it

    def __enter__(self) -> OutDirLock:
        with translated_os_errors(self.path, "taking the lock"):      # a full or read-only disk: one line
            self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _dir_flock:
    """An exclusive flock on a directory for the duration of a `with` (a no-op where flock is unavailable).

    The kernel drops it when its holder dies, so it can never go stale."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.fd: int | None = None

    def __enter__(self) -> None:
        try:
            import fcntl

            self.fd = os.open(self.directory, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError) as err:
            log.debug("no flock on %s (%s): taking over without it", self.directory, err)
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)                        # closing the descriptor releases the flock
            self.fd = None
