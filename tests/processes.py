"""Runs of several processes on this machine, as the multi-process tests make them: each process a child
Python with its own simulated CPU devices (`cpu_env`), the processes joined by gloo collectives on a free
loopback port (`gloo_env`, `free_port`), all started at once and all waited for under one deadline
(`run_processes`, or `jaxcore_processes` for `jaxcore SUBCOMMAND` itself)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

TAIL = 3000        # characters of a failed process's stderr that a failure shows


def free_port() -> int:
    """A loopback port no one listens on now (the system's pick for port 0), for a run's coordinator."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def cpu_env(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a child that runs JAX on `devices` simulated CPU devices, plus `extra`."""
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
            **extra}


def gloo_env(devices_per_process: int, **extra: str) -> dict[str, str]:
    """`cpu_env` with gloo CPU collectives: what each process of a multi-process run needs."""
    return cpu_env(devices_per_process, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", **extra)


def start_process(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`command` started with `env`, its stdout and stderr captured as text (read them with communicate())."""
    return subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_processes(commands: Sequence[Sequence[str]], env: dict[str, str], timeout: float, *,
                  check: bool = True) -> list[subprocess.CompletedProcess[str]]:
    """Start every command at once (process i runs commands[i]) and wait for all of them, `timeout` s in all;
    each one's exit code, stdout and stderr. All are killed when the time is up (processes that do not agree
    wait on each other forever), and the test fails in one line that ends with their stderr. With `check`,
    the first process (in order) that exits other than 0 fails the test with its stderr's tail, the others
    killed; without, the caller reads the exit codes."""
    procs = [start_process(command, env) for command in commands]
    deadline, done = time.monotonic() + timeout, []
    try:
        for rank, proc in enumerate(procs):
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                tails = {}
                for i in range(rank, len(procs)):
                    err = procs[i].communicate()[1]
                    tails[i] = (procs[i].returncode, err[-TAIL // 2:])
                pytest.fail(f"{len(procs)} process(es) did not finish in {timeout:.0f} s; (exit code, stderr) of "
                            f"those killed: {tails!r}")
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
            if check and proc.returncode != 0:
                pytest.fail(f"process {rank} of {len(procs)} exited with {proc.returncode}; its stderr ends:\n"
                            f"{err[-TAIL:]}")
    finally:
        for proc in procs:                      # none outlives the call, whatever stopped it
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done


def jaxcore_processes(subcommand: str, args: Sequence[str], processes: int, devices: int, timeout: float, *,
                      check: bool = True) -> list[subprocess.CompletedProcess[str]]:
    """`jaxcore SUBCOMMAND ARGS` as `processes` processes of `devices` CPU devices each, gloo collectives on
    loopback (one process: no distributed.* settings), through `run_processes`."""
    port = free_port()
    commands = [[sys.executable, "-m", "jaxcore.cli", subcommand, *args,
                 *([f"distributed.coordinator=localhost:{port}", f"distributed.num_processes={processes}",
                    f"distributed.process_id={rank}"] if processes > 1 else [])]
                for rank in range(processes)]
    return run_processes(commands, gloo_env(devices), timeout, check=check)
