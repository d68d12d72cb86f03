"""Every user-facing error type in one place (no heavy imports: reward workers load it too).

The CLI prints any of `USER_ERRORS` as one line and exits with code 2: they mean bad input or a run
that cannot go on, never a bug. The modules that raise them re-export them under their old names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Interrupted(KeyboardInterrupt):
    """A stop signal that ended work which cannot be resumed half-way (the final export): the message says what was
    kept and what to do; the exit code is the shell's for the signal (128 + its number)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class OutputError(UserError):
    """An output that cannot be written safely (it exists, overlaps an input, is a link or the wrong kind, or the
    disk is full or read-only); nothing that existed before was changed."""


class ConfigValueError(ValueError):
    """A config file or override that does not fit the config schema."""


class ConfigTypeError(ConfigValueError, TypeError):
    """A config value of the wrong type (a string where an integer belongs): also a TypeError for the API."""


class ConfigError(ValueError):
    """A model config that jaxcore cannot represent faithfully."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written faithfully."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (e.g. a full disk); earlier checkpoints are intact."""


class NoRestorableCheckpointError(FileNotFoundError):
    """No checkpoint under the directory restores."""


class CheckpointReadError(RuntimeError):
    """A checkpoint could not be read for a reason that does not prove it corrupt (memory, I/O, permissions):
    nothing is moved, and resuming again after fixing the cause reads it."""


class ResumeError(ValueError):
    """The checkpoints cannot be resumed (none restores, or the config changed incompatibly)."""


class OutDirLockedError(RuntimeError):
    """Another live run holds the out_dir lock."""


class PromptLengthError(ValueError):
    """A prompt or max_new_tokens that does not fit the model's positions."""


class TaskError(ValueError):
    """A task could not be built or its data is malformed."""


class RewardFunctionError(TaskError):
    """A reward function or reward model cannot be imported, called or trusted (`rewards.functions`)."""


class TaskConfigError(ValueError):
    """A task name or option the registry does not know."""


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. too many consecutive NaN steps)."""


class OutOfMemoryError(TrainingError):
    """The device or host ran out of memory (XLA's RESOURCE_EXHAUSTED, Python's MemoryError): one line naming the
    settings that size what ran out. The process's own `std::bad_alloc` abort cannot be caught (its lock is then
    taken over by the next run: a dead pid on the same host is a stale lock)."""


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is an out-of-memory error Python sees: `MemoryError` (numpy's too), or XLA's runtime error
    with status RESOURCE_EXHAUSTED (device or host allocation failed)."""
    if isinstance(err, MemoryError):
        return True
    return (type(err).__name__ in ("XlaRuntimeError", "JaxRuntimeError")
            and ("RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower()))


def out_of_memory(err: BaseException, lower: str) -> OutOfMemoryError:
    """The one-line `OutOfMemoryError` for `err` (`is_out_of_memory`), naming what to `lower`."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    what = f"{type(err).__name__}: {lines[0][:160]}" if lines else type(err).__name__
    return OutOfMemoryError(f"out of memory ({what}): {lower}")


USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError, ConfigValueError, ConfigError, CheckpointError, CheckpointWriteError, CheckpointReadError,
    NoRestorableCheckpointError,
    ResumeError, OutDirLockedError, PromptLengthError, TaskError, RewardFunctionError, TaskConfigError, TrainingError,
    FileNotFoundError)


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The text of a user's file, strictly UTF-8, or a UserError naming the file and the problem (missing,
    unreadable, not UTF-8 or holding an encoded unpaired surrogate)."""
    file = Path(path)
    if not file.is_file():
        kind = "no such" if not file.exists() else "not a regular file (a directory, a device or a pipe): give a"
        raise UserError(f"{path}: {kind} {what}")
    try:
        data = file.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror})") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r})") from err


def read_json_object(path: str | os.PathLike, what: str = "file",
                     error: type[Exception] = CheckpointError) -> dict[str, Any]:
    """A user's JSON file that must hold one object (config.json, jaxcore.json, tokenizer.json), or `error` with
    one line naming the file and the problem (missing, unreadable, not UTF-8, invalid JSON, not an object)."""
    try:
        data = json.loads(read_text(path, what))
    except UserError as err:
        raise error(str(err)) from err
    except json.JSONDecodeError as err:
        raise error(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from err
    if not isinstance(data, dict):
        raise error(f"{path}: must be a JSON object, got {type(data).__name__}")
    return data


def check_text(value: str, where: str) -> str:
    """`value` unless it holds an unpaired surrogate (JSON's "\\ud800" escape): no tokenizer or file takes those."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"{where}: unpaired surrogate {value[err.start]!r} at character {err.start}") from err
    return value
