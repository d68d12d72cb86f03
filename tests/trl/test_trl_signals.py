"""Ctrl-C or SIGTERM during a jaxcore.trl script's `trainer.train()` (issue 51): the run finishes its generation and
checkpoints, then the script ends as the signal ends TRL's: SIGINT as KeyboardInterrupt (the process dies of SIGINT,
the shell's 130), SIGTERM with exit code 143, one line saying what was kept, and nothing after `train()` runs.
Before, `train()` returned normally and the script went on and exited 0, so a scheduler saw a killed run succeed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys
from jaxcore.trl import GRPOConfig, GRPOTrainer

calls = []


def reward_len(completions, **kwargs):
    calls.append(1)
    if len(calls) == 3:          # the probe call, generation 0, then the signal during generation 1's scoring
        os.kill(os.getpid(), getattr(signal, sys.argv[3]))
    return [-float(len(c)) for c in completions]


args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                  max_steps=4, save_steps=100, disable_tqdm=True)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=args,
                      train_dataset=[{"prompt": f"Count to {i}."} for i in range(8)])
trainer.train()
print("AFTER TRAIN")
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_checkpoints_then_ends_the_script_with_the_signals_code(tiny_dir, tmp_path, signum):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_dir("llama")), str(out), signum.name], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "AFTER TRAIN" not in done.stdout, done.stderr[-3000:]
    # SIGINT: an uncaught KeyboardInterrupt ends the process by SIGINT itself (-2 here, 130 in a shell), as TRL's
    assert done.returncode == (128 + signum if signum == signal.SIGTERM else -signum), (done.returncode,
                                                                                       done.stderr[-3000:])
    line = f"stopped by {signum.name} after step 1 of 4: checkpoint {out / 'checkpoints' / '0'}; continue with " \
           "trainer.train(resume_from_checkpoint=True)"
    assert line in done.stderr and "Traceback" not in done.stderr.split(line)[1], done.stderr[-3000:]
    assert (out / "checkpoints" / "0").is_dir() and not (out / ".lock").exists()
