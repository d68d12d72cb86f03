"""Writing an output safely: every command that writes a file or a directory goes through here.

The rules (`check_output`), each broken one a one-line `OutputError` before anything is written:

- an output never equals, contains or lies inside one of the command's inputs (even with overwrite: an
  input is never deleted or changed);
- an output that exists and is not empty is replaced only with `overwrite`;
- an output that is a symbolic link, a special file (a named pipe, a device, a socket: `refuse_special`), a file
  where a directory is expected (or the reverse), or whose parent cannot be written (a read-only mount, a file in
  the way) is refused: an output is written as a regular file, never through a device or pipe nor over one.

Writing (`write_directory`, `open_output`, `write_text`) goes to a temporary sibling that is renamed into
place only once complete, so a failure half-way (a full disk, an error, Ctrl-C) leaves whatever was there
before untouched and no partial output. Every `OSError` (ENOSPC, EROFS, EACCES, ...) becomes one line
naming the path and the reason (`os_error_line`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal

from jaxcore.errors import OutputError

log = logging.getLogger(__name__)

Kind = Literal["dir", "file"]
PathLike = str | os.PathLike
# Where `current_umask` reads the process umask (the "Umask:" line) without changing it.
PROC_STATUS = Path("/proc/self/status")
_NAMED_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)    # recognised by their text alone
# A path that is neither a regular file, a directory nor a link, in words.
_SPECIAL_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def os_error_line(err: BaseException, path: PathLike, action: str = "writing") -> str:
    """One line for a failed write: `PATH: writing failed (No space left on device)`."""
    return f"{path}: {action} failed ({os_reason(err)})"


def os_reason(err: BaseException) -> str:
    """The OS error behind `err` in words (`os.strerror`: "No space left on device"), else its first line."""
    os_err = os_error_in(err)
    if os_err is not None and os_err.errno:
        return os.strerror(os_err.errno)
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def os_error_in(err: BaseException | None) -> OSError | None:
    """The first `OSError` with an errno in `err`'s cause/context chain, else one made from the first error whose
    message names an OS error (safetensors' "I/O error: No space left on device (os error 28)", tensorstore's
    status text): libraries wrap them. None when there is none."""
    seen = 0
    while err is not None and seen < 20:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        code = _errno_in_text(str(err))
        if code is not None:
            return OSError(code, os.strerror(code))
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _errno_in_text(text: str) -> int | None:
    match = re.search(r"os error (\d+)|errno[ =:]*(\d+)", text, re.IGNORECASE)
    if match:
        return int(match.group(1) or match.group(2))
    for code in _NAMED_ERRNOS:
        if os.strerror(code).lower() in text.lower():
            return code
    return None


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _is_empty(path: Path) -> bool:
    if path.is_dir():
        return not any(path.iterdir())
    return path.stat().st_size == 0


def special_kind(path: PathLike) -> str | None:
    """What `path` is in words when it is a special file ("a named pipe", "a character device", "a block device",
    "a socket"; a link is not followed), else None (a regular file, a directory, a link, nothing)."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((words for test, words in _SPECIAL_KINDS if test(mode)), None)


def refuse_special(path: PathLike, name: str = "output", hint: str = "choose another path") -> None:
    """A one-line `OutputError` when `path` is a special file: renaming a new file onto it would replace the pipe or
    the device (as root, /dev/full itself), and writing through it could hang on a pipe or send the output nowhere.
    `name` names the argument, `hint` what the user can do."""
    kind = special_kind(path)
    if kind is not None:
        raise OutputError(f"{name} {path} is {kind}, not a regular file: outputs are written as files, never "
                          f"through or over {kind} ({hint})")


def check_output(path: PathLike, *, kind: Kind = "dir", inputs: Iterable[PathLike | None] = (),
                 overwrite: bool = False, name: str = "output", overwrite_hint: str = "pass --overwrite") -> Path:
    """Refuse an output that breaks one of the module's rules (one-line `OutputError`); returns the path.

    `inputs` are the paths the command reads (None entries are ignored); `name` names the argument in the
    message, `overwrite_hint` what the user can do about an existing output."""
    out = Path(path)
    if out.is_symlink():
        raise OutputError(f"{name} {out} is a symbolic link; give the path it points to (or another one)")
    refuse_special(out, name)
    refuse_overlap(out, inputs, name)
    if out.exists():
        if kind == "dir" and not out.is_dir():
            raise OutputError(f"{name} {out} exists and is not a directory")
        if kind == "file" and out.is_dir():
            raise OutputError(f"{name} {out} is a directory; expected a file path")
        if not overwrite and not _is_empty(out):
            raise OutputError(f"{name} {out} already exists and is not empty ({overwrite_hint} to replace it, "
                              "or choose another path)")
    check_parent(out, name)
    return out


def refuse_overlap(path: PathLike, inputs: Iterable[PathLike | None], name: str = "output", *,
                   containing: bool = True) -> None:
    """A one-line `OutputError` when `path` is one of `inputs` (None entries ignored), lies inside one or (with
    `containing`) contains one: an input is never written over, even with overwrite."""
    resolved = Path(path).resolve()
    for source in inputs:
        if source is None:
            continue
        src = Path(source).resolve()
        if resolved == src:
            raise OutputError(f"{name} {path} is also an input; write the output somewhere else")
        if containing and _within(src, resolved):
            raise OutputError(f"{name} {path} contains the input {source}; write the output somewhere else")
        if _within(resolved, src):
            raise OutputError(f"{name} {path} is inside the input {source}; write the output somewhere else")


def check_parent(path: PathLike, name: str = "output", shown: PathLike | None = None) -> None:
    """Refuse a path whose nearest existing ancestor is a file or cannot be written (read-only, no permission);
    the message names `name` and `shown` (default: `path`)."""
    shown = path if shown is None else shown
    parent = Path(path).absolute().parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():                                   # a dangling link in the way
            raise OutputError(f"{name} {shown}: {parent} is a broken symbolic link")
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{name} {shown}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only(parent) else "permission denied"
        raise OutputError(f"{name} {shown}: cannot write in {parent} ({reason})")


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextlib.contextmanager
def translated_os_errors(path: PathLike, action: str = "writing") -> Iterator[None]:
    """Turn an `OSError` (anywhere in the raised error's chain) into a one-line `OutputError`."""
    try:
        yield
    except OutputError:
        raise
    except Exception as err:
        if os_error_in(err) is None:
            raise
        raise OutputError(os_error_line(err, path, action)) from err


def make_parents(path: PathLike) -> None:
    """`mkdir -p` of a path's parent, with a one-line error."""
    parent = Path(path).absolute().parent
    with translated_os_errors(parent, "creating the directory"):
        parent.mkdir(parents=True, exist_ok=True)


def write_directory(out_dir: PathLike, write: Callable[[Path], Any], *, inputs: Iterable[PathLike | None] = (),
                    overwrite: bool = True, name: str = "output") -> Path:
    """Run `write(tmp_dir)` in a temporary sibling of `out_dir` and move the result into place only once it
    completed; an existing `out_dir` (replaced only with `overwrite`) is removed only after the new one is in
    place. `check_output` first; any failure removes the temporary directory and leaves `out_dir` as it was."""
    out = check_output(out_dir, kind="dir", inputs=inputs, overwrite=overwrite, name=name)
    make_parents(out)
    with translated_os_errors(out):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.absolute().parent))
    try:
        with translated_os_errors(out):
            write(tmp)
            make_readable(tmp)
            _swap_in(tmp, out)
    except BaseException:
        remove_tree(tmp)
        raise
    return out


def remove_tree(path: Path, attempts: int = 20) -> None:
    """Remove a temporary directory; retried for a while because a library's background threads (orbax's, after
    a failed save) may still be creating files in it. What cannot be removed is logged, never raised."""
    for attempt in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        time.sleep(0.05 * (attempt + 1))
    log.warning("could not remove the temporary directory %s", path)


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` is renamed aside first, put back if the rename fails, and
    deleted only once `tmp` is in place."""
    if not out.exists():
        tmp.rename(out)
        return
    if _is_empty(out) and out.is_dir():
        out.rmdir()
        tmp.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def open_output(path: PathLike, mode: str = "w", *, inputs: Iterable[PathLike | None] = (), overwrite: bool = False,
                name: str = "output", overwrite_hint: str = "pass --overwrite") -> Iterator[IO[Any]]:
    """A file handle on a temporary sibling of `path`, renamed to `path` (fsynced, with the umask's mode) when
    the `with` block ends without an error; on any error the temporary file is removed and `path` is untouched."""
    out = check_output(path, kind="file", inputs=inputs, overwrite=overwrite, name=name,
                       overwrite_hint=overwrite_hint)
    make_parents(out)
    with translated_os_errors(out):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.absolute().parent)
    tmp = Path(tmp_name)
    try:
        with translated_os_errors(out):
            with os.fdopen(fd, mode) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            tmp.chmod(0o666 & ~current_umask())
            os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: PathLike, text: str, **options: Any) -> Path:
    """Write `text` to `path` through `open_output` (same rules and options)."""
    with open_output(path, **options) as handle:
        handle.write(text)
    return Path(path)


def current_umask() -> int:
    """The process umask, read from /proc/self/status ("Umask:", octal; Linux >= 4.7) without changing it.

    Only where /proc cannot say does it fall back to setting and restoring `os.umask`, which is
    process-global: a file another thread creates in between would get mode 0666/0777.
    """
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


def make_readable(directory: Path) -> None:
    """Give a finished directory the modes of a plain `mkdir`/`open` under the current umask (mkdtemp and
    some writers create 0700/0600), so other users and tools can read the output."""
    umask = current_umask()
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


# ----------------------------------------------------------------------------- orbax's error logs

# How a file path or a traceback names orbax's sources (records, coroutines left over from a restore).
ORBAX_DIR = f"{os.sep}orbax{os.sep}"


class OrbaxErrorsToDebug(logging.Filter):
    """Drop orbax's ERROR records and re-log their first line at DEBUG: the same failure reaches
    the code that started the write as an exception and is reported there in one line.

    Two kinds: orbax's own (multi-line tracebacks from its save threads), and asyncio's "Task exception was
    never retrieved" for orbax's other per-array reads when a restore fails on one array (the record comes
    from asyncio; its message names the orbax coroutine).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        from_orbax = ORBAX_DIR in (record.pathname or "") or called_from_orbax()
        orbax_task = record.name == "asyncio" and "never retrieved" in message and ORBAX_DIR in message
        if from_orbax or orbax_task:
            log.debug("orbax: %s", message.splitlines()[0] if message else "")
            return False
        return True


def called_from_orbax() -> bool:
    """Whether orbax code is on the current call stack: absl's `logging.exception`/`error` name absl's own file as
    the record's pathname, so a record orbax logs through them is recognised by its caller."""
    frame = sys._getframe(1)
    while frame is not None:
        if ORBAX_DIR in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


ORBAX_FILTER = OrbaxErrorsToDebug()


def orbax_left_over(unraisable: Any) -> bool:
    """True for the two errors an orbax read or write that failed on one array leaves behind from the others,
    which the default hook prints as tracebacks on stderr although the failure is reported in one line:

    - tensorstore's "Event loop is closed", when a read or write finishes after orbax's event loop closed;
    - orbax's own per-array read coroutine, collected while suspended, raising from its close().
    """
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None and ORBAX_DIR in code.co_filename:
        return True
    if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"):
        return False
    tb = unraisable.exc_traceback
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.endswith(os.path.join("asyncio", "base_events.py"))


def install_unraisable_filter() -> None:
    """Wrap `sys.unraisablehook` to drop `orbax_left_over` errors (logged at DEBUG); others pass on."""
    previous = sys.unraisablehook
    if getattr(previous, "_jaxcore_filter", False):
        return

    def hook(unraisable: Any) -> None:
        if orbax_left_over(unraisable):
            log.debug("ignored an error left over from a failed orbax read or write: %s",
                      os_reason(unraisable.exc_value) if unraisable.exc_value is not None else "")
            return
        previous(unraisable)

    hook._jaxcore_filter = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def demote_orbax_errors() -> None:
    """Install `ORBAX_FILTER` on the loggers orbax's errors arrive on and `install_unraisable_filter` (idempotent):
    a failed orbax write or read (a full disk) is then one line from whoever catches its exception, not pages of
    background-thread tracebacks."""
    for name in ("absl", "orbax", "asyncio"):
        if ORBAX_FILTER not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(ORBAX_FILTER)
    install_unraisable_filter()
