"""A whole run in a fresh Python process, as a user starts one: its result and its wall time from the process's
start (imports, loading and compilation count; a user waits for them too). The `trl` and `qiu` suites run their
sides this way."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jaxcore.runtime import host_allocator
from jaxcore.runtime.programs import process_start_time


def since_start() -> float:
    """Seconds since this process started."""
    started = process_start_time()
    return time.time() - started if started is not None else float("nan")


def run_in_child(target: str, spec: dict[str, Any], out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`target` ("module:function", called with `spec` as keyword arguments and `out=out / "run"`) in a fresh
    process with `env` added to this one's environment; its JSON result, plus `wall_s` (from the process's start
    to the function's return) and `host_malloc` (the allocator policy it ran with)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps({"target": target, "spec": spec}))
    subprocess.run([sys.executable, "-c", "import sys; from jaxcore.bench import child; child.child_main(sys.argv[1])",
                    str(out)], env={**os.environ, **(env or {})}, check=True)
    return json.loads((out / "result.json").read_text())


def child_main(out_dir: str) -> None:
    """The child process of `run_in_child`: reads `spec.json` in `out_dir`, writes `result.json` there."""
    host_allocator.keep_freed_host_memory()     # as the jaxcore command does, before the child's JAX work
    out = Path(out_dir)
    job = json.loads((out / "spec.json").read_text())
    module, function = job["target"].split(":")
    got = getattr(importlib.import_module(module), function)(**job["spec"], out=out / "run")
    got["wall_s"] = since_start()
    got["host_malloc"] = host_allocator.policy()
    (out / "result.json").write_text(json.dumps(got))
