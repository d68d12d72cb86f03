"""What SIGTERM and SIGINT do, from a command's start to its exit (one policy, each phase a handler):

- start-up and any command outside training (`stops_the_command`): an `Interrupted` raised where the program is,
  so the command's cleanup runs, one line is printed and the exit code is the signal's (130 / 143);
- between training epochs, a flag the loop checks (`StopSignal`: finish the epoch, checkpoint, exit 143 / 130);
- during the final export, which cannot stop half-way, an `Interrupted` raised into it (`interrupts_export`: its
  temporary copy is removed, the lock released, and one line says the checkpoints are kept);
- once the command has its exit code (`exits_at_once`): the process ends at once with the signal's code, so a
  second Ctrl-C during JAX's and orbax's shutdown work is not a traceback.

An exception raised inside a gc callback (JAX registers one) or a finalizer is printed as "Exception ignored" and
dropped, so the run would go on as if no signal came: `raise_when_safe` sends such a signal again a moment later
instead, when the handler runs outside.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from jaxcore.errors import Interrupted

log = logging.getLogger("jaxcore.runtime.runner")
STOPPING = (signal.SIGTERM, signal.SIGINT)
RESEND_S = 0.05            # how soon a signal that arrived where an exception would be dropped is sent again


def where_exceptions_are_dropped(frame: types.FrameType | None) -> bool:
    """Whether `frame` (or a caller) is a gc callback or a `__del__`, where Python prints and drops an exception."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def raise_when_safe(error: BaseException, signum: int, frame: types.FrameType | None) -> None:
    """Raise `error` from the handler of `signum`, or, where it would be dropped (`where_exceptions_are_dropped`),
    send `signum` again shortly so that the handler then in place sees it outside."""
    if where_exceptions_are_dropped(frame):
        timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise error


def stop_message(signum: int, during: str = "") -> str:
    """"interrupted" for Ctrl-C, "stopped by SIGTERM" for the others (with what it stopped, if given)."""
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return f"{what} during {during}" if during else what


@contextlib.contextmanager
def signal_handlers(handle: Callable[[int, Any], None]) -> Iterator[None]:
    """`handle` for SIGTERM and SIGINT while the block runs, the previous handlers restored after. Python sets
    handlers on the main thread only: on another (`trainer.train()` started on a thread) the block runs under the
    process's own handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handle) for sig in STOPPING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks between epochs (handlers restored on exit).

    `on_signal` is called (from the handler, last) on the first signal: e.g. `Scorer.interrupt`, so that a hung
    reward function cannot hold the run past its grace period."""

    def __init__(self, on_signal: Callable[[], None] | None = None) -> None:
        self.received: int | None = None
        self._handlers = signal_handlers(self._handle)
        self._on_signal = on_signal

    def __enter__(self) -> StopSignal:
        self._handlers.__enter__()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:          # a second signal: stop now
            raise_when_safe(Interrupted(stop_message(signum), signum), signum, frame)
            return
        self.received = signum
        log.warning("received %s: finishing this epoch, then checkpointing", signal.Signals(signum).name)
        if self._on_signal is not None:
            self._on_signal()

    def __exit__(self, *exc: Any) -> None:
        self._handlers.__exit__(*exc)


@contextlib.contextmanager
def interrupts_export(what: str) -> Iterator[None]:
    """SIGTERM/SIGINT while `what` runs raise `Interrupted` into it, naming what stopped and that the checkpoints
    are kept (so the export's cleanup runs and the lock is released, where SIGTERM's default would kill the process
    mid-write). Signal handlers can only be set on the main thread; elsewhere this does nothing."""
    def handle(signum: int, frame: Any) -> None:
        raise_when_safe(Interrupted(f"stopped by {signal.Signals(signum).name} during {what}: nothing was written "
                                    "there; the checkpoints are kept: run again with --resume to export", signum),
                        signum, frame)

    with signal_handlers(handle):
        yield


def stops_the_command() -> contextlib.AbstractContextManager[None]:
    """SIGTERM/SIGINT raise `Interrupted` ("interrupted" / "stopped by SIGTERM", exit 130 / 143) while the block
    runs: a command's start-up and its work outside the phases that handle a stop themselves."""
    def handle(signum: int, frame: Any) -> None:
        raise_when_safe(Interrupted(stop_message(signum), signum), signum, frame)

    return signal_handlers(handle)


def exits_at_once() -> None:
    """From now on SIGTERM/SIGINT end the process at once with the signal's exit code, without running the exit
    handlers (JAX's and orbax's shutdown work, which a second Ctrl-C would otherwise break with a traceback). For a
    program that has decided its exit code; main thread only."""
    def handle(signum: int, _frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        for sig in STOPPING:
            signal.signal(sig, handle)
