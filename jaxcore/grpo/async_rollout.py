"""Asynchronous GRPO's rollout worker: a thread that generates the batches it is given, in order, each from the
weight version the schedule names (`jaxcore.grpo.async_schedule`), while the main thread trains (issue 53).

The worker holds one version at a time: it takes version v's weights when its next batch needs them and lets the
older ones go, so a version replaces the one before only once that one's batches are generated. What a batch
generates depends only on its job (prompts, key, version), never on when it ran: the overlap is timing, the
result is not. A job without a version (TRL's free-running mode) takes the newest published when it starts, so
its result depends on timing (`version_of` says which it took). Idle seconds (no batch whose weights are
published) are counted: the rollout's wait for weights.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Job:
    """One batch to generate: its index, the weight version it is generated from (None: the newest published when
    it starts), and what `generate` needs."""

    batch: int
    version: int | None
    work: Any


class RolloutWorker:
    """Runs `generate(weights, job)` for each submitted job on a thread of its own, in submission order."""

    def __init__(self, generate: Callable[[Any, Job], Any]):
        self._generate = generate
        self._cond = threading.Condition()
        self._jobs: collections.deque[Job] = collections.deque()
        self._versions: dict[int, Any] = {}
        self._done: dict[int, Any] = {}
        self._made_with: dict[int, int] = {}     # the version each generated batch took
        self._running: int | None = None         # the batch being generated
        self._error: BaseException | None = None
        self._closed = False
        self._idle = 0.0                # seconds waited for weights since `waited_for_weights` last read them
        self.generated = 0               # batches generated
        self._thread = threading.Thread(target=self._loop, name="jaxcore-rollout", daemon=True)
        self._thread.start()

    def publish(self, version: int, weights: Any) -> None:
        """Make `version`'s weights (already on the rollout devices) available to the jobs that need them."""
        with self._cond:
            self._versions[version] = weights
            self._cond.notify_all()

    def submit(self, job: Job) -> None:
        """Queue a batch (after every batch submitted before it)."""
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()

    def put(self, batch: int, output: Any, version: int) -> None:
        """A batch generated before from `version` (a checkpoint's), as if this worker had made it."""
        with self._cond:
            self._done[batch] = output
            self._made_with[batch] = version
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Fail the batches not yet generated with `error` (their weights will never come): `result` raises it."""
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()

    def result(self, batch: int) -> Any:
        """Batch `batch`'s output, waited for; a failure of the worker is raised here."""
        with self._cond:
            while batch not in self._done and self._error is None:
                self._cond.wait()
            if batch not in self._done:
                raise self._error                  # type: ignore[misc]
            return self._done[batch]

    def forget(self, batch: int) -> None:
        """Let batch `batch`'s output go (trained, or dropped as too stale)."""
        with self._cond:
            self._done.pop(batch, None)
            self._made_with.pop(batch, None)

    def version_of(self, batch: int) -> int:
        """The weight version batch `batch` was generated from (once generated)."""
        with self._cond:
            return self._made_with[batch]

    def holds(self, batch: int) -> bool:
        """Whether `batch` is generated, being generated or queued."""
        with self._cond:
            return (batch == self._running or batch in self._done
                    or any(job.batch == batch for job in self._jobs))

    def waited_for_weights(self) -> float:
        """Seconds the worker sat idle for want of published weights since the last call."""
        with self._cond:
            idle, self._idle = self._idle, 0.0
            return idle

    def close(self) -> None:
        """Stop after the batch being generated (the queue is dropped)."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
        self._thread.join()

    def _next(self) -> tuple[Job, Any] | None:
        """The next job and its weights, once both are there (None: closed); older versions are let go."""
        with self._cond:
            began = time.perf_counter()
            while not self._closed and not self._ready():
                self._cond.wait()
            self._idle += time.perf_counter() - began
            if self._closed:
                return None
            job = self._jobs.popleft()
            if job.version is None:
                job = dataclasses.replace(job, version=max(self._versions))
            for old in [v for v in self._versions if v < job.version]:
                del self._versions[old]
            self._made_with[job.batch] = job.version
            self._running = job.batch
            return job, self._versions[job.version]

    def _ready(self) -> bool:
        """Whether the next job's weights are published (under the lock)."""
        if not self._jobs:
            return False
        version = self._jobs[0].version
        return bool(self._versions) if version is None else version in self._versions

    def _loop(self) -> None:
        while True:
            taken = self._next()
            if taken is None:
                return
            job, weights = taken
            try:
                output = self._generate(weights, job)
            except BaseException as err:  # noqa: BLE001 -- raised on the main thread by `result`
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            with self._cond:
                self._done[job.batch] = output
                self._running = None
                self.generated += 1
                self._cond.notify_all()
