"""A small pool of spawn/forkserver worker processes that run reward jobs with a timeout.

Each worker receives the pickled reward functions once at start-up, then runs jobs
``(fn_name, completions, examples[, keywords])`` one at a time (``keywords``: further keyword arguments of the
call, such as TRL's ``trainer_state``). A job that raises comes back as an
error; a job that runs past its timeout, or whose worker dies, has its worker killed and
replaced. Workers never come from ``fork``: the parent runs JAX, whose threads do not
survive a fork. With spawn/forkserver the parent's ``__main__`` is re-imported in each
worker, so scripts must keep their entry point under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from jaxcore.rewards.clock import running_time
from jaxcore.rewards.types import Example, RewardFn

START_METHODS = ("spawn", "forkserver")
Job = tuple[str, list[str], list[Example]] | tuple[str, list[str], list[Example], dict[str, Any]]
Outcome = tuple[bool, Any]
"""``(True, values)`` or ``(False, reason)``."""
STOPPING = "not scored: the run is stopping"     # the outcome of a job abandoned by `interrupt`
POLL_S = 0.25          # how often a waiting `run` looks at `stopping` (a signal handler sets it)


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`, for one-line failure warnings."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


class RewardTimeout(BaseException):
    """Raised into a reward function that ran past its timeout (a BaseException: `except Exception` in user
    code cannot swallow it)."""


class _Alarm:
    """SIGALRM for one in-process call: raises `RewardTimeout` into it once it has run `timeout_s` seconds
    (`running_time`: a span the process was stopped does not count; the alarm is re-armed for what is left). An
    alarm someone else set (e.g. pytest-timeout's) is kept: if it is due first its handler runs, and it is re-armed
    afterwards."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.armed = False

    def __enter__(self) -> _Alarm:
        self.previous = signal.signal(signal.SIGALRM, self._handler)
        self.start = running_time()
        old_delay, self.old_interval = signal.setitimer(signal.ITIMER_REAL, 0)
        self.old_deadline = time.monotonic() + old_delay if old_delay > 0 else None
        self.armed = True
        self._arm(self.timeout_s)
        return self

    def _arm(self, left_s: float) -> None:
        """The timer for `left_s` more seconds, or until the other alarm is due, whichever is first."""
        if self.old_deadline is not None:
            left_s = min(left_s, self.old_deadline - time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, max(left_s, 1e-6))

    def _handler(self, signum: int, frame: Any) -> None:
        if not self.armed:
            return
        if self.old_deadline is not None and time.monotonic() >= self.old_deadline and callable(self.previous):
            self.armed = False
            self.previous(signum, frame)              # the other alarm was due first: its handler decides
            return
        left_s = self.timeout_s - (running_time() - self.start)
        if left_s > 1e-3:                             # the process was stopped meanwhile: that span does not count
            self._arm(left_s)
            return
        self.armed = False
        raise RewardTimeout

    def __exit__(self, *exc: Any) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        if self.old_deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, max(self.old_deadline - time.monotonic(), 1e-6), self.old_interval)


def alarm_available() -> bool:
    """Whether an in-process call can be timed out: SIGALRM exists and this is the main thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def kept_process_state(what: str) -> Iterator[None]:
    """Undo what user code (`what`, e.g. a reward function) changed of the process while the block ran: the working
    directory (the run's relative paths, the model, out_dir and the data, must keep their meaning) and, on the main
    thread, the SIGINT/SIGTERM handlers (a stop signal must still stop the run). Warns once per kind of change."""
    cwd = os.getcwd()
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS} if main else {}
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.getcwd() != cwd:
                os.chdir(cwd)
                _warn_once("the working directory", what, f"changed back to {cwd} (the run's relative paths are "
                           "read from there)")
        changed = [sig for sig, handler in handlers.items() if signal.getsignal(sig) is not handler]
        for sig in changed:
            signal.signal(sig, handlers[sig])
        if changed:
            _warn_once("signal handlers", what, "put back (" + ", ".join(signal.Signals(s).name for s in changed)
                       + " must still stop the run)")


_warned: set[str] = set()


def _warn_once(kind: str, what: str, done: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        logging.getLogger("jaxcore.rewards").warning("%s changed %s; %s", what, kind, done)


def call_with_timeout(fn: Callable[..., Any], args: Sequence[Any], timeout_s: float | None) -> Outcome:
    """`(True, fn(*args))`, or `(False, reason)` when it raised (SystemExit included: user code cannot end the
    run) or ran past `timeout_s` seconds. The timeout is SIGALRM's (main thread only; `alarm_available`): it
    interrupts Python code, sleeps and blocking I/O, not a C extension that never returns to Python (use
    worker processes, `rewards.num_workers`, for such code). Ctrl-C (KeyboardInterrupt) is not caught. A change
    of the working directory or the stop signals' handlers is undone (`kept_process_state`)."""
    timed = timeout_s is not None and timeout_s > 0 and alarm_available()
    try:
        with kept_process_state("a reward function"), _Alarm(timeout_s) if timed else contextlib.nullcontext():
            return True, fn(*args)
    except RewardTimeout:
        return False, f"timed out after {timeout_s:g} s"
    except (Exception, SystemExit) as e:
        return False, one_line(e)


def pickle_reward_fns(reward_fns: Mapping[str, RewardFn]) -> bytes:
    """Pickle the reward functions, naming the first one that cannot be pickled."""
    for name, fn in reward_fns.items():
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise ValueError(
                f"reward function '{name}' cannot be sent to worker processes ({e}); use a "
                "module-level function or functools.partial of one, or num_workers=0"
            ) from None
    return pickle.dumps(dict(reward_fns))


def _worker_main(conn: Connection) -> None:
    """Worker loop: load the reward functions, then answer jobs until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        fns = pickle.loads(conn.recv_bytes())
    except BaseException as e:
        conn.send(("startup_error", one_line(e)))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        name, completions, examples, *keywords = job
        try:
            result: Outcome = (True, fns[name](completions, examples, **(keywords[0] if keywords else {})))
        except BaseException as e:
            result = (False, one_line(e))
        try:
            conn.send(("done", result))
        except Exception as e:
            conn.send(("done", (False, f"result could not be sent back ({one_line(e)})")))


class _Worker:
    """One worker process, its pipe and what it is doing."""

    def __init__(self, ctx: Any, payload: bytes, startup_timeout_s: float) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.conn.send_bytes(payload)
        self.ready = False
        self.job: int | None = None
        self.deadline = running_time() + startup_timeout_s

    @property
    def waiting(self) -> bool:
        """Starting up or running a job."""
        return not self.ready or self.job is not None

    def request_stop(self) -> None:
        """Ask the worker to exit after its current job."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass

    def kill(self) -> None:
        """Kill the process (no-op if it has exited) and close the pipe."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()


class WorkerPool:
    """``num_workers`` long-lived processes holding ``reward_fns``; see the module doc."""

    def __init__(
        self,
        reward_fns: Mapping[str, RewardFn],
        num_workers: int,
        start_method: str = "spawn",
        startup_timeout_s: float = 120.0,
    ) -> None:
        if start_method not in START_METHODS:
            raise ValueError(
                f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}"
            )
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._payload = pickle_reward_fns(reward_fns)
        self._ctx = multiprocessing.get_context(start_method)
        self._num_workers = num_workers
        self._startup_timeout_s = startup_timeout_s
        self._workers: list[_Worker] = []
        self.stopping = False              # set by `interrupt` (from a signal handler): jobs end at once

    def run(self, jobs: Sequence[Job], timeout_s: float) -> list[Outcome]:
        """Run ``jobs``, each limited to ``timeout_s`` seconds once it reaches a worker (after `interrupt`,
        none is run: each comes back as a failure).

        Raises RuntimeError (after closing the pool) if a worker cannot start.
        """
        if not jobs:
            return []
        if self.stopping:
            return [(False, STOPPING)] * len(jobs)
        self._workers = [w for w in self._workers if self._reusable(w)]
        while len(self._workers) < self._num_workers:
            self._workers.append(self._new_worker())
        queue = deque(range(len(jobs)))
        outcomes: list[Outcome | None] = [None] * len(jobs)
        while queue or any(w.job is not None for w in self._workers):
            for worker in self._workers:
                if worker.ready and worker.job is None and queue:
                    index = queue.popleft()
                    try:
                        worker.conn.send(jobs[index])
                    except Exception as e:
                        outcomes[index] = (False, f"could not send job ({one_line(e)})")
                        self._replace(worker)
                        continue
                    worker.job, worker.deadline = index, running_time() + timeout_s
            if self.stopping:
                self._abandon(queue, outcomes)
                break
            waiting = [w for w in self._workers if w.waiting]
            timeout = min(max(0.0, min(w.deadline for w in waiting) - running_time()), POLL_S)
            ready_conns = wait([w.conn for w in waiting], timeout)
            for worker in waiting:
                if worker.conn in ready_conns:
                    self._receive(worker, outcomes)
                elif running_time() >= worker.deadline:
                    self._expire(worker, outcomes, timeout_s)
        return [o if o is not None else (False, "job was not run") for o in outcomes]

    def interrupt(self) -> None:
        """Stop the jobs of the current and every later `run` at once (safe to call from a signal handler):
        running jobs' workers are killed, and every job not done comes back as a failure."""
        self.stopping = True

    def _abandon(self, queue: deque[int], outcomes: list[Outcome | None]) -> None:
        """After `interrupt`: fail the queued jobs and the running ones (their workers killed and replaced)."""
        queue.clear()
        for worker in list(self._workers):
            if worker.job is not None:
                outcomes[worker.job] = (False, STOPPING)
                worker.job = None
                worker.kill()
                self._workers.remove(worker)

    def close(self, grace_s: float = 1.0) -> None:
        """Stop all workers: ask them to exit, kill those still alive after ``grace_s``."""
        for worker in self._workers:
            worker.request_stop()
        deadline = time.monotonic() + grace_s
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            worker.kill()
        self._workers = []

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self._payload, self._startup_timeout_s)

    @staticmethod
    def _reusable(worker: _Worker) -> bool:
        """Keep a live, idle worker; kill one that died or was left busy by an interrupt."""
        if worker.process.is_alive() and worker.job is None:
            return True
        worker.kill()
        return False

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._new_worker()

    def _startup_failed(self, reason: str) -> NoReturn:
        self.close()
        raise RuntimeError(f"reward worker process failed to start: {reason}")

    def _receive(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        try:
            kind, payload = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(1.0)
            kind, payload = "died", f"worker process died (exit code {worker.process.exitcode})"
        if not worker.ready:
            if kind != "ready":
                self._startup_failed(str(payload))
            worker.ready = True
            return
        assert worker.job is not None
        outcomes[worker.job] = payload if kind == "done" else (False, payload)
        worker.job = None
        if kind != "done":
            self._replace(worker)

    def _expire(self, worker: _Worker, outcomes: list[Outcome | None], timeout_s: float) -> None:
        if not worker.ready:
            self._startup_failed(f"not ready after {self._startup_timeout_s:g} s")
        assert worker.job is not None
        outcomes[worker.job] = (False, f"timed out after {timeout_s:g} s (worker killed)")
        self._replace(worker)
