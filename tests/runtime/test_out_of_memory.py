"""Out of memory (issue 51): under `ulimit -v` GRPO aborted with std::bad_alloc (exit 134), no line, the lock left.
What Python can catch (XLA's RESOURCE_EXHAUSTED, MemoryError) is one line naming the settings to lower, exit code 2,
the lock released; a C++ abort cannot be caught, and the lock it leaves names a dead pid on this host, which the
next run takes over as stale. The errors are forced (a real OOM would take the machine's memory)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import pytest

from tests.cli_runs import es_args, grpo_args, run_cli

RESOURCE_EXHAUSTED = jax.errors.JaxRuntimeError(
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.\nBufferAssignment OOM Debugging.")


def raising(error):
    def train_step(self, *args, **kwargs):
        raise error

    return train_step


@pytest.mark.parametrize("error", [RESOURCE_EXHAUSTED, MemoryError()], ids=["resource_exhausted", "memory_error"])
@pytest.mark.parametrize("command", ["grpo", "es"])
def test_out_of_memory_in_training_is_one_line_naming_what_to_lower(tiny_dir, tmp_path, capsys, monkeypatch,
                                                                     command, error):
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.grpo.algorithm import GRPOAlgorithm

    algorithm = GRPOAlgorithm if command == "grpo" else EggrollAlgorithm
    monkeypatch.setattr(algorithm, "train_step", raising(error))
    out = tmp_path / "out"
    make_args = grpo_args if command == "grpo" else es_args
    code, err = run_cli(capsys, command, *make_args(tiny_dir("llama"), out, "train.epochs=1", "train.eval_every=-1"))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"jaxcore {command}: error: out of memory ({type(error).__name__}"), err
    lower = "rollout.prompts_per_epoch or rollout.generations_per_prompt" if command == "grpo" else "es.population"
    assert lower in err[0] and "jaxcore plan shows what a config needs" in err[0], err
    assert not (out / ".lock").exists()


def test_out_of_memory_outside_training_is_one_line(tiny_dir, capsys, monkeypatch):
    monkeypatch.setattr("jaxcore.inference.generate.generate", raising(RESOURCE_EXHAUSTED))
    code, err = run_cli(capsys, "generate", "--model", tiny_dir("llama"), "--prompt", "hi")
    assert code == 2 and err == ["jaxcore: error: out of memory (JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                                 "while trying to allocate 17179869184 bytes.): lower the sizes the command was given "
                                 "(batch, lengths)"], err


def test_a_jaxcore_trl_run_names_trls_arguments(tiny_dir, tmp_path, monkeypatch):
    from jaxcore.errors import OutOfMemoryError
    from jaxcore.grpo.algorithm import GRPOAlgorithm
    from jaxcore.trl import GRPOConfig, GRPOTrainer

    monkeypatch.setattr(GRPOAlgorithm, "train_step", raising(RESOURCE_EXHAUSTED))
    trainer = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                          num_generations=4, max_completion_length=4, max_steps=1),
                          train_dataset=[{"prompt": f"{i}"} for i in range(8)])
    with pytest.raises(OutOfMemoryError, match=r"lower per_device_train_batch_size or num_generations"):
        trainer.train()
    assert not (tmp_path / "out" / ".lock").exists()


def test_the_lock_a_killed_run_leaves_is_taken_over(tmp_path):
    """What std::bad_alloc's abort leaves: a lock naming a pid that no longer runs, on this host. The next run takes
    it over (a documented limit: the abort itself cannot be caught)."""
    from jaxcore.runtime.run_guard import OutDirLock

    done = subprocess.Popen([sys.executable, "-c", ""])
    done.wait()
    pid = done.pid                                                  # a pid that ran here and is gone
    (tmp_path / ".lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    with OutDirLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert not (tmp_path / ".lock").exists()
