"""What SIGTERM and SIGINT do during a run: between epochs, a flag the loop checks (`StopSignal`: finish the epoch,
checkpoint, exit 143 / 130); during the final export, which cannot stop half-way, an `Interrupted` raised into it
(`interrupts_export`: its temporary copy is removed, the lock released, and one line says the checkpoints are kept).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from jaxcore.errors import Interrupted

log = logging.getLogger("jaxcore.runtime.runner")
STOPPING = (signal.SIGTERM, signal.SIGINT)


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

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None:          # a second signal: stop now
            raise KeyboardInterrupt
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
    def handle(signum: int, _frame: Any) -> None:
        raise Interrupted(f"stopped by {signal.Signals(signum).name} during {what}: nothing was written there; the "
                          "checkpoints are kept: run again with --resume to export", signum)

    with signal_handlers(handle):
        yield
