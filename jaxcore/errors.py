"""Every user-facing error type in one place (no heavy imports: reward workers load it too).

The CLI prints any of `USER_ERRORS` as one line and exits with code 2: they mean bad input or a run
that cannot go on, never a bug. The modules that raise them re-export them under their old names.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class ConfigValueError(ValueError):
    """A config file or override that does not fit the config schema."""


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


USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError, ConfigValueError, ConfigError, CheckpointError, CheckpointWriteError, CheckpointReadError,
    NoRestorableCheckpointError,
    ResumeError, OutDirLockedError, PromptLengthError, TaskError, RewardFunctionError, TaskConfigError, TrainingError,
    FileNotFoundError)
