"""A clock for the timeouts on calls into user code that leaves out the time the process was stopped.

SIGSTOP/SIGCONT (Ctrl-Z and `fg`, a debugger, a scheduler suspending the job) stops every thread of the process,
but not the wall clock: a reward function that was well inside its timeout would be timed out the moment the
process continues, and the epoch trained on fallbacks. `running_time` advances with the wall clock between two of
its readings, except that a gap longer than `MAX_GAP_S` counts as `HEARTBEAT_S`: a heartbeat thread reads it every
`HEARTBEAT_S`, so only a process that was stopped (or not scheduled at all) leaves such a gap.
"""

from __future__ import annotations

import os
import threading
import time

HEARTBEAT_S = 0.1
MAX_GAP_S = 1.0

_lock = threading.RLock()
_state = {"last": 0.0, "running": 0.0}
_heartbeat: list[threading.Thread] = []


def running_time() -> float:
    """Seconds (monotonic, any origin) the process has been running: stopped spans left out."""
    with _lock:
        if not _heartbeat:
            _state["last"] = time.monotonic()
            thread = threading.Thread(target=_beat, daemon=True, name="jaxcore-clock")
            _heartbeat.append(thread)
            thread.start()
            os.register_at_fork(after_in_child=_heartbeat.clear)     # a forked child starts its own
        now = time.monotonic()
        gap = now - _state["last"]
        _state["running"] += gap if gap <= MAX_GAP_S else HEARTBEAT_S
        _state["last"] = now
        return _state["running"]


def _beat() -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        running_time()
