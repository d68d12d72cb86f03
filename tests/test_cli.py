"""The `jaxcore` and `torchref` entry points: Ctrl-C during start-up is one line and exit code 130, also where
JAX's gc callback runs; a Ctrl-C during the program's exit ends it at once."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("cli,where,argv", [
    ("jaxcore.cli", "build_parser", ["es"]),               # importing the subcommand modules
    ("jaxcore.cli", "quiet_library_logs", ["es"]),         # after parsing, before the command runs
    ("torchref.cli", "build_parser", ["rft-data"]),
])
def test_ctrl_c_during_start_up_prints_interrupted_without_traceback(monkeypatch, capsys, cli, where, argv):
    module = importlib.import_module(cli)
    monkeypatch.setattr(module if where == "build_parser" else importlib.import_module("jaxcore.cli"), where,
                        interrupt)
    capsys.readouterr()
    try:
        code = module.main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): the user sees a traceback")
    err = capsys.readouterr().err
    assert code == 130 and err.strip().splitlines() == ["interrupted"] and "Traceback" not in err, err


# A program whose first gc pass after the model starts loading sends it SIGINT and stays inside the gc callback
# until Python has run the signal handler there: an exception raised in a gc callback is printed and dropped.
CTRL_C_IN_A_GC_CALLBACK = """
import gc, os, signal, sys
import jaxcore.hf.model_checkpoint as mc
from jaxcore.cli import main
loading, sent = [], []
def poke(phase, info):
    if loading and not sent and phase == "start":
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(2_000_000):
            pass
gc.callbacks.append(poke)
real = mc.load_any
def load_any(*args, **kwargs):
    loading.append(1)
    gc.collect()
    return real(*args, **kwargs)
mc.load_any = load_any
sys.exit(main(sys.argv[1:]))
"""

# The program's exit handlers (JAX's and orbax's run there) meet a second Ctrl-C.
CTRL_C_AT_EXIT = """
import atexit, os, signal, sys, time
from jaxcore.cli import main
def late_ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(3)
atexit.register(late_ctrl_c)
sys.exit(main())
"""


def run_program(source: str, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", source, *argv], env=env, capture_output=True, text=True,
                          timeout=300)


def test_ctrl_c_inside_jaxs_gc_callback_still_stops_the_command(tiny_dir):
    """(Before: the KeyboardInterrupt was raised inside the gc callback, printed as "Exception ignored" and
    dropped; the command finished with exit code 0.)"""
    done = run_program(CTRL_C_IN_A_GC_CALLBACK, "generate", "--model", str(tiny_dir("llama")), "--prompt", "hi",
                       "--max-new-tokens", "400", "--temperature", "0")
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines() == ["interrupted"], done.stderr[-2000:]


def test_ctrl_c_during_the_programs_exit_ends_it_without_a_traceback():
    """(Before: the exit handler was interrupted and Python printed its traceback.)"""
    done = run_program(CTRL_C_AT_EXIT, "--help")
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr == "", done.stderr[-2000:]
