"""rft-train runs unchanged under torchrun: two CPU processes (gloo DDP) split each global batch."""

import json
import os
import subprocess
import sys

import pytest

from torchref.rft.data import make_split, write_json


def test_torchrun_two_processes(tiny_dir, tmp_path):
    entries = [(q, a, f"Multiply. <answer>{a:.6g}</answer>") for q, a in make_split("train", 16, 0)]
    write_json(tmp_path / "sft.json", entries)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = ["-m", "torchref.cli", "rft-train", "--model", str(tiny_dir("llama")), "--data",
               str(tmp_path / "sft.json"), "--out", str(tmp_path / "run"), "--max-steps", "4", "--batch-size", "4",
               "--logging-steps", "1", "--save-strategy", "no", "--merge", "--no-progress"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(torchrun + command, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert log["summary"]["world_size"] == 2 and log["summary"]["steps"] == 4
    # 2 processes x 4 examples = 8 per step: 4 steps are two passes over the 16 examples.
    assert log["log_history"][-1]["epoch"] == pytest.approx(2.0)
    assert (tmp_path / "run" / "merged" / "model.safetensors").is_file()
    assert proc.stdout.count("trained 4 steps") == 1 and "merged:" in proc.stdout   # only the main process
