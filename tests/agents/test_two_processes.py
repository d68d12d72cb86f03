"""A multi-turn rollout over two processes (2 x 2 CPU devices, gloo collectives on loopback; `two_processes.py`):
each process builds, resets and calls the environments of its own rows only, every row runs exactly once, and
both processes end with the same tokens; a TRL reward function reading `environments` scores every row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from processes import free_port, gloo_env, run_processes


def test_each_process_runs_only_its_rows_environments_and_both_get_the_same_tokens(make_model, path, tmp_path):
    from jaxcore.hf.convert import save_hf

    model_dir = save_hf(make_model(), tmp_path / "scripted", tokenizer_dir=path)
    script = Path(__file__).with_name("two_processes.py")
    port = free_port()
    run_processes([[sys.executable, str(script), str(model_dir), str(tmp_path), str(port), str(rank)]
                   for rank in range(2)], gloo_env(2), timeout=300)
    seen = [json.loads((tmp_path / f"process{rank}.json").read_text()) for rank in range(2)]

    assert seen[0]["owned"] == [0, 1, 2, 3] and seen[1]["owned"] == [4, 5, 6, 7]     # rows over the 4 devices
    for rank, process in enumerate(seen):
        for event in ("reset", "increment"):          # each of its own rows once, no other process's row
            assert sorted(row for e, p, row in process["records"] if e == event) == process["owned"], (rank, event)
        assert {p for _, p, _ in process["records"]} == {rank}
    for key in ("prompt_ids", "tokens", "lengths", "model_mask", "calls", "counted"):
        assert seen[0][key] == seen[1][key], key
    assert seen[0]["calls"] == [1] * 8 and min(seen[0]["lengths"]) > 0
    # the reward function read each row's live instance on the process that ran it: the step the row sampled
    rewards = [seen[0]["env_reward"][r] if r < 4 else seen[1]["env_reward"][r] for r in range(8)]
    assert seen[0]["counted"] == rewards and set(rewards) <= {2.0, 4.0} and len(set(rewards)) == 2
