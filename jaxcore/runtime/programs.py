"""Making programs, apart from running them: what a run spends tracing, lowering and compiling (or loading from the
persistent cache), and programs made ahead of need on a background thread.

JAX reports every program it makes through `jax.monitoring`, as a span per stage: tracing a function to a jaxpr,
lowering it to StableHLO, and XLA's compilation (which a persistent-cache hit replaces by a load). `ledger()` keeps
those spans per thread; their union over a stretch of time is what that thread spent making programs (a jit traced
inside another's trace is not counted twice), so a step's own work is its wall time minus the compile time inside it.

    clock = PhaseClock()
    with clock.phase("rollout"): ...                # wall seconds minus the making of programs inside
    clock.metrics()                                 # {"timing/rollout": ..., "timing/compile": ..., "compile/...": ...}
    ahead = AheadOfTime(); ahead.submit(key, make); ahead.wait(key)     # make programs on a background thread
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax

log = logging.getLogger(__name__)

STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}
CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}


@dataclasses.dataclass(frozen=True)
class Span:
    thread: int
    stage: str                  # "trace" | "lower" | "compile" (XLA's, or a load from the persistent cache)
    start: float                # time.time()
    end: float
    name: str                   # the function or module JAX names


@dataclasses.dataclass
class MakeTotals:
    """Seconds spent making programs (each stage's union of spans, and `seconds`, the union of all of them), the
    programs XLA compiled or loaded, and the persistent cache's hits and misses among them."""

    seconds: float = 0.0
    trace_s: float = 0.0
    lower_s: float = 0.0
    compile_s: float = 0.0
    programs: int = 0
    hits: int = 0
    misses: int = 0

    def metrics(self, prefix: str = "compile/") -> dict[str, float]:
        return {f"{prefix}{k}": round(v, 4) if isinstance(v, float) else v
                for k, v in dataclasses.asdict(self).items() if k != "seconds"}


def _union(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class Ledger:
    """Every span of program making JAX reported since the ledger started listening, and the cache events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[Span] = []
        self.cache_events: list[tuple[int, float, str]] = []      # (thread, time, "hits" | "misses")

    def _on_span(self, event: str, start: float, end: float, **kwargs: Any) -> None:
        stage = STAGES.get(event)
        if stage is not None:
            with self._lock:
                self.spans.append(Span(threading.get_ident(), stage, start, end, str(kwargs.get("fun_name", ""))))

    def _on_event(self, event: str, **_: Any) -> None:
        kind = CACHE_EVENTS.get(event)
        if kind is not None:
            with self._lock:
                self.cache_events.append((threading.get_ident(), time.time(), kind))

    def totals(self, since: float = 0.0, until: float | None = None, thread: int | None = None,
               exclude_thread: int | None = None) -> MakeTotals:
        """What was made between `since` and `until` (time.time(); spans clipped to it), by `thread` (None: any),
        or by every thread but `exclude_thread`."""
        until = time.time() if until is None else until

        def counted(t: int) -> bool:
            return (thread is None or t == thread) and t != exclude_thread

        with self._lock:
            spans = [s for s in self.spans if counted(s.thread) and s.end > since and s.start < until]
            events = [kind for t, at, kind in self.cache_events if counted(t) and since <= at <= until]

        def clipped(stage: str | None) -> list[tuple[float, float]]:
            return [(max(s.start, since), min(s.end, until)) for s in spans if stage is None or s.stage == stage]

        counts = collections.Counter(events)
        return MakeTotals(seconds=_union(clipped(None)), trace_s=_union(clipped("trace")),
                          lower_s=_union(clipped("lower")), compile_s=_union(clipped("compile")),
                          programs=sum(s.stage == "compile" for s in spans if s.end <= until),
                          hits=counts["hits"], misses=counts["misses"])

    def names(self, stage: str = "compile", since: float = 0.0) -> list[str]:
        """The programs a stage handled since `since`, in order (e.g. the ones XLA compiled)."""
        with self._lock:
            return [s.name for s in self.spans if s.stage == stage and s.end >= since]


_LEDGER: Ledger | None = None


def ledger() -> Ledger:
    """The process's ledger, listening from the first call on."""
    global _LEDGER
    if _LEDGER is None:
        _LEDGER = Ledger()
        jax.monitoring.register_event_time_span_listener(_LEDGER._on_span)
        jax.monitoring.register_event_listener(_LEDGER._on_event)
    return _LEDGER


def process_start_time() -> float | None:
    """When this process started (time.time()), from /proc on Linux; None where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        import os

        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Wall time of an epoch's phases with the making of programs on this thread (and any wait for one being made
    on the background thread) taken out of each and counted as `timing/compile`: a phase's number is its own work,
    whether or not it met a new shape."""

    def __init__(self) -> None:
        ledger()                                            # listening from here on
        self.began = time.time()
        self.seconds: dict[str, float] = {}
        self.compile_s = 0.0
        self._waiting_s = 0.0          # waits for the background thread (not making on this one) in the open phase

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start, self._waiting_s = time.time(), 0.0
        try:
            yield
        finally:
            end = time.time()
            making = ledger().totals(start, end, thread=threading.get_ident()).seconds
            self.seconds[name] = self.seconds.get(name, 0.0) + (end - start) - making - self._waiting_s
            self.compile_s += making + self._waiting_s

    def wait(self, ahead: AheadOfTime, key: Hashable) -> None:
        """`ahead.wait(key)`, counted as making programs: the program a step needs is made by now."""
        start = time.time()
        ahead.wait(key)
        end = time.time()
        self._waiting_s += (end - start) - ledger().totals(start, end, thread=threading.get_ident()).seconds

    def metrics(self) -> dict[str, float]:
        """`timing/<phase>` for every phase, `timing/compile`, and this thread's making of programs since the clock
        started, stage by stage (`compile/trace_s`, ..., `compile/hits`), and the background thread's
        (`compile/ahead_s`, `compile/ahead_programs`)."""
        mine = threading.get_ident()
        made = ledger().totals(self.began, thread=mine)
        ahead = ledger().totals(self.began, exclude_thread=mine)
        return {**{f"timing/{k}": v for k, v in self.seconds.items()}, "timing/compile": self.compile_s,
                **made.metrics(), "compile/ahead_s": round(ahead.seconds, 4), "compile/ahead_programs": ahead.programs}


def spare_host_cores() -> bool:
    """Whether making programs on a background thread is free: on an accelerator the host's cores idle while the
    device computes; on the CPU backend the device is those cores, and below 8 of them a thread tracing and
    compiling takes a real share from the step it overlaps, so there only the surely needed program is made ahead."""
    return jax.default_backend() != "cpu" or (os.cpu_count() or 1) >= 8


class AheadOfTime:
    """Programs made on one background thread, in the order submitted, while the caller does other work.

    `submit(key, make)` queues `make()` (which should lower and compile, e.g. `jitted.lower(*abstract).compile()`:
    JAX's caches then serve the real call). `wait(key)` returns once that job is done: it waits for it when the
    thread is making it, and runs it at once on the caller's thread when it is still queued (a program needed now
    does not wait behind others, and is never made twice at the same time). A job that fails is logged and left
    to the real call, which then makes (and reports) it itself."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Hashable | None] = queue.Queue()
        self._jobs: dict[Hashable, Callable[[], Any] | None] = {}      # None once taken by a thread
        self._done: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, key: Hashable, make: Callable[[], Any]) -> bool:
        """Queue `make` under `key` unless that key was submitted before; True when queued."""
        with self._lock:
            if key in self._done or self._closed:
                return False
            self._jobs[key], self._done[key] = make, threading.Event()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="jaxcore-ahead-of-time", daemon=True)
                self._thread.start()
        self._queue.put(key)
        return True

    def submitted(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._done

    def pending(self) -> int:
        """Jobs submitted and not done."""
        with self._lock:
            return sum(not done.is_set() for done in self._done.values())

    def _take(self, key: Hashable) -> Callable[[], Any] | None:
        with self._lock:
            make = self._jobs.get(key)
            self._jobs[key] = None
            return make

    def _run(self, key: Hashable, make: Callable[[], Any]) -> None:
        try:
            make()
        except Exception as err:  # noqa: BLE001 -- the real call makes the program and reports any error itself
            log.debug("making %s ahead of time failed: %s", key, err)
        finally:
            self._done[key].set()

    def wait(self, key: Hashable) -> None:
        """Return once the job under `key` is done (at once when it was never submitted)."""
        with self._lock:
            done = self._done.get(key)
        if done is None:
            return
        make = self._take(key)
        if make is not None:
            self._run(key, make)
        done.wait()

    def drain(self) -> None:
        """Return once every job submitted so far is done (the thread makes them; nothing is taken over)."""
        with self._lock:
            events = list(self._done.values())
        for done in events:
            done.wait()

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            make = self._take(key)
            if make is not None:
                self._run(key, make)

    def close(self) -> None:
        """Drop the jobs not started and wait for the one running."""
        with self._lock:
            self._closed = True
            thread = self._thread
            for key, make in self._jobs.items():
                if make is not None:
                    self._jobs[key] = None
                    self._done[key].set()
        if thread is not None:
            self._queue.put(None)
            thread.join()
