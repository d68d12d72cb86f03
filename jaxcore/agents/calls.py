"""Running the model's tool calls: standalone tools in the reward worker pool when `rewards.num_workers > 0`
(a timeout and crash isolation, as for reward functions), else in this process; environment methods always in
this process (their instance's state lives here). In this process a call runs on a daemon thread and is given up
after `timeout_s` (a hung environment instance is then dropped: its episode ends). A call that raises, hangs,
crashes its worker, names no tool of its row or could not be parsed becomes an error result the model reads,
never a crash of the run.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxcore.agents.tools import Tool, ToolCall, error_result, tool_text
from jaxcore.rewards.clock import running_time
from jaxcore.rewards.workers import WorkerPool, kept_process_state, one_line


@dataclasses.dataclass
class CallResult:
    """What one call returned, as the text of its tool message."""

    name: str
    content: str
    ok: bool
    hung: bool = False          # an in-process call given up after the timeout


def call_in_thread(fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float) -> tuple[bool, Any, bool]:
    """`fn(**kwargs)` on a daemon thread: (ok, value or one-line error, hung). Hung: it ran `timeout_s` seconds of
    `running_time` (a span the process was stopped does not count). A change of the working directory is undone."""
    box: dict[str, tuple[bool, Any]] = {}

    def target() -> None:
        try:
            box["out"] = (True, fn(**kwargs))
        except BaseException as err:  # noqa: BLE001 -- a tool's SystemExit too is the model's error, not ours
            box["out"] = (False, one_line(err))

    thread = threading.Thread(target=target, daemon=True, name="jaxcore-tool")
    with kept_process_state("a tool or an environment"):
        started = running_time()
        thread.start()
        left_s = timeout_s
        while left_s > 1e-3:        # a span the process was stopped (SIGSTOP) does not count toward the timeout
            thread.join(left_s)
            if not thread.is_alive():
                break
            left_s = timeout_s - (running_time() - started)
    if thread.is_alive():
        return False, f"timed out after {timeout_s:g} s", True
    return (*box["out"], False)


def _as_text(fn: Callable[..., Any]) -> Callable[..., str]:
    """`fn` called with a tool call's arguments, returning `tool_text` (any argument name passes through)."""
    def call(**arguments: Any) -> str:
        return tool_text(fn, arguments)
    return call


class CallRunner:
    """Runs a turn's calls of every row; owns the worker pool of standalone tools (close it with `close`)."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float, num_workers: int = 0):
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self.pool = WorkerPool(self.tools, num_workers) if num_workers > 0 and tools else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def run(self, calls: Sequence[tuple[ToolCall, Mapping[str, Callable[..., Any]]]]) -> list[CallResult]:
        """Each (call, the tools its row may use by name): results in order. Standalone tools of the pool run
        there, all of the turn's at once."""
        results: list[CallResult | None] = [None] * len(calls)
        jobs: list[tuple[int, str, dict[str, Any]]] = []
        for i, (call, available) in enumerate(calls):
            if call.error:
                results[i] = CallResult(call.name or "unknown", error_result(call.error), False)
            elif call.name not in available:
                results[i] = CallResult(call.name, error_result(f"Tool {call.name} not found."), False)
            elif self.pool is not None and available[call.name] is self.tools.get(call.name):
                jobs.append((i, call.name, call.arguments))
            else:
                fn = available[call.name]
                ok, value, hung = call_in_thread(_as_text(fn.fn if isinstance(fn, Tool) else fn), call.arguments,
                                                 self.timeout_s)          # the text made on the thread too
                results[i] = CallResult(call.name, value if ok else error_result(value), ok, hung)
        if jobs:
            outcomes = self.pool.run([(name, [arguments], []) for _, name, arguments in jobs], self.timeout_s)
            for (i, name, _), (ok, value) in zip(jobs, outcomes):
                results[i] = CallResult(name, value[0] if ok else error_result(value), ok)
        return [r for r in results if r is not None]
