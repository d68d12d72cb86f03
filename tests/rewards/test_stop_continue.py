"""SIGSTOP/SIGCONT (Ctrl-Z and `fg`) in the middle of a call into user code does not count toward its timeout:
in-process rewards (SIGALRM), tool and environment calls (a thread) and reward worker processes. The whole process
group is stopped for 3 s while a call that works for 0.5 s of CPU time runs under a 2.5 s timeout.

(Before: the wall clock ran on while the process was stopped, and each call was timed out as it continued.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("way", ["in-process", "thread", "workers"])
def test_a_stopped_span_does_not_time_out_a_call(way):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-m", "tests.rewards.stopped_program", way], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline().strip() == "calling", child.stderr.read()
        time.sleep(0.3)
        os.killpg(child.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.killpg(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["wall_s"] > 3.0, outcome              # the stop did land inside the call
    assert outcome["ok"] is True, (outcome, err[-2000:])
