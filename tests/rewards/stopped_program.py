"""A program for test_stop_continue.py: makes one timed call into slow user code (2.5 s timeout, 0.5 s of CPU
work, which a stopped process does not do) in the way named by argv[1], printing "calling" just before it and the
outcome as JSON after."""

from __future__ import annotations

import json
import sys
import time


def slow(*_args, **_kwargs) -> list[float]:
    started = time.process_time()
    while time.process_time() - started < 0.5:
        pass
    return [1.0]


def main(way: str) -> None:
    if way == "in-process":
        from jaxcore.rewards.workers import call_with_timeout

        call = lambda: call_with_timeout(slow, [], 2.5)[0]           # noqa: E731
    elif way == "thread":
        from jaxcore.agents.calls import call_in_thread

        call = lambda: call_in_thread(slow, {}, 2.5)[0]              # noqa: E731
    else:
        from jaxcore.rewards.workers import WorkerPool

        pool = WorkerPool({"slow": slow}, 1)
        pool.run([("nothing", [], [])], 60.0)                        # the worker is up
        call = lambda: pool.run([("slow", [], [])], 2.5)[0][0]       # noqa: E731
    print("calling", flush=True)
    started = time.monotonic()
    ok = call()
    print(json.dumps({"ok": ok, "wall_s": time.monotonic() - started}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
