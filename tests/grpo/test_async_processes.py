"""Asynchronous GRPO over two processes (issue 53): process 0 trains on its 4 CPU devices, process 1 generates on its
4, gloo collectives on loopback (`async_two_processes.py`). The run equals the one-process asynchronous run on 8
devices (4 training, 4 generating) under the same collectives bit for bit, at lag 0 and at lag 1 with a sync every 2
steps: weights, losses and every logged metric. Every sync moves each weight once, by one collective-permute per
weight in the compiled program, with no array read back to the host.

The one-process run is made under gloo too (`jax.distributed` with one process): gloo sums a reduction over the
training devices in another order than the in-process collectives, so a metric such as `kl` would differ in its last
bit from a run without it (the weights and losses do not).

A two-process run stopped after a checkpoint and resumed equals the straight one bit for bit, and held-out
evaluation equals the one-process run's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runs import final_params, grpo_args
from processes import free_port, gloo_env, run_processes

from jaxcore.hf.convert import read_safetensors

ONE_LAYOUT = ["train.eval_every=-1", "train.checkpoint_every=-1", "optimizer.schedule=constant"]
TIMINGS = ("timing/", "compile/", "time", "_s")      # when, and how long things took: not the run's values


def values(rows: list[dict], keys: list[str]) -> list[list]:
    """Each row's `keys` that are not timings."""
    kept = [k for k in keys if not any(k.startswith(t) or k.endswith(t) for t in TIMINGS)]
    return [[r.get(k) for k in kept] for r in rows]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def processes(out: Path, args: list[str], count: int) -> list[dict]:
    """`jaxcore grpo ARGS` as `count` processes over 8 CPU devices, gloo collectives; what each saw."""
    port, script = free_port(), Path(__file__).with_name("async_two_processes.py")
    seen = out.parent / f"{out.name}-seen"
    seen.mkdir(exist_ok=True)          # a resumed run's processes write theirs over the first run's
    for old in seen.glob("process*.json"):
        old.unlink()
    run_processes([[sys.executable, str(script), str(seen), str(port), str(rank), str(count), json.dumps(args)]
                   for rank in range(count)], gloo_env(8 // count), timeout=540)
    return [json.loads((seen / f"process{rank}.json").read_text()) for rank in range(count)]


@pytest.mark.parametrize(("lag", "sync_steps", "epochs"), [(0, 1, 3), (1, 2, 4)])
def test_two_processes_equal_the_one_process_run_bit_for_bit(tiny_dir, tmp_path, lag, sync_steps, epochs):
    model = tiny_dir("llama")
    overrides = [*ONE_LAYOUT, f"train.epochs={epochs}", f"grpo.asynchronous.max_staleness={lag}",
                 f"grpo.asynchronous.weight_sync_steps={sync_steps}"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert processes(one, grpo_args(model, one, *overrides), 1)[0]["code"] == 0
    seen = processes(two, grpo_args(model, two, *overrides), 2)

    assert [p["code"] for p in seen] == [0, 0] and [p["local_devices"] for p in seen] == [4, 4]
    a, b = final_params(one), final_params(two)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    assert any(not np.array_equal(x, y) for x, y in zip(b.values(), read_safetensors(model).values()))
    rows_one, rows_two = records(one), records(two)
    logged = sorted(rows_one[0])
    assert {"loss", "reward", "grad_norm", "kl", "ratio", "entropy", "sample/staleness_max"} <= set(logged)
    assert values(rows_two, logged) == values(rows_one, logged)
    # the generating process logs what the training process measured (its runner stays in step)
    assert values(records(two / "process1"), logged) == values(rows_two, logged)

    syncs = [(step + 1) // sync_steps for step in range(epochs)]             # one per weight_sync_steps
    assert [r["async/weight_syncs"] for r in rows_two] == syncs
    assert [r["sample/staleness_max"] for r in rows_two] == [
        float(k // sync_steps - max(0, k // sync_steps - lag)) for k in range(epochs)]
    weights = rows_one[-1]["async/weight_transfers"] // syncs[-1]     # the one-process sync's weights per sync
    assert weights > 0         # every weight once per sync, by one collective-permute each
    assert [r["async/weight_transfers"] for r in rows_two] == [n * weights for n in syncs]
    assert {r["async/weight_permutes"] for r in rows_two if r["async/weight_syncs"]} == {weights}
    for process in seen:
        assert process["syncs"] == [syncs[-1]] and process["transfers"] == [syncs[-1] * weights]
        assert process["permutes"] == [weights] and process["host_reads"] == []


def test_two_processes_stopped_and_resumed_equal_the_straight_run_bit_for_bit(tiny_dir, tmp_path):
    """Lag 1, a sync every 2 steps, a checkpoint every step: stopped after 3 steps (between syncs: batch 3 of version
    0 stored as generated and version 1's weights beside the train state, both from the generating process; batches
    4 and 5 generated again), then resumed for 6: the straight two-process run bit for bit, weights, losses and every
    logged metric but timings, on both processes."""
    model = tiny_dir("llama")
    common = ["train.eval_every=-1", "train.checkpoint_every=1", "optimizer.schedule=constant",
              "grpo.asynchronous.max_staleness=1", "grpo.asynchronous.weight_sync_steps=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert [p["code"] for p in processes(straight, grpo_args(model, straight, "train.epochs=6", *common), 2)] == [0, 0]
    assert [p["code"] for p in processes(resumed, grpo_args(model, resumed, "train.epochs=3", *common), 2)] == [0, 0]
    assert sorted(int(p.name) for p in (resumed / "checkpoints").iterdir()) == [0, 1, 2]
    again = processes(resumed, ["--resume", *grpo_args(model, resumed, "train.epochs=6", *common)], 2)
    assert [p["code"] for p in again] == [0, 0]

    a, b = final_params(straight), final_params(resumed)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    rows = records(straight)
    logged = sorted(rows[0])
    assert [r["step"] for r in records(resumed)] == [1, 2, 3, 4, 5, 6]
    assert values(records(resumed), logged) == values(rows, logged)
    assert values(records(resumed / "process1"), logged) == values(rows, logged)
    assert [r["sample/staleness_max"] for r in rows] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_held_out_evaluation_across_processes_equals_the_one_process_run(tiny_dir, tmp_path):
    """Held-out evaluation before training and every step: the training process generates on its devices, both
    processes score; the eval metrics (and everything else logged) equal the one-process run's, on both processes."""
    model = tiny_dir("llama")
    overrides = ["train.eval_every=1", "train.checkpoint_every=-1", "optimizer.schedule=constant", "train.epochs=2",
                 "grpo.asynchronous.max_staleness=1", "grpo.asynchronous.weight_sync_steps=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert processes(one, grpo_args(model, one, *overrides), 1)[0]["code"] == 0
    assert [p["code"] for p in processes(two, grpo_args(model, two, *overrides), 2)] == [0, 0]

    rows_one = records(one)
    logged = sorted(set().union(*rows_one))
    evaluated = [k for k in logged if k.startswith("eval/")]
    assert "eval/reward" in evaluated and [r["step"] for r in rows_one if "eval/reward" in r] == [0, 1, 2]
    assert values(records(two), logged) == values(rows_one, logged)
    assert values(records(two / "process1"), logged) == values(rows_one, logged)


def test_each_group_lies_on_one_process_and_the_groups_have_one_size():
    from types import SimpleNamespace

    from jaxcore.grpo.async_processes import process_roles
    from jaxcore.grpo.async_transfer import ProcessSync

    on = lambda *processes: [SimpleNamespace(process_index=p) for p in processes]      # noqa: E731
    assert process_roles(on(0, 0), on(1, 1)) == (0, 1)
    for train, rollout in ((on(0, 1), on(1, 1)), (on(0, 0), on(0, 0)), (on(0, 0), on(1, 2))):
        with pytest.raises(ValueError, match="trains on one process and generates on the other") as err:
            process_roles(train, rollout)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="groups of the same size: 3 training and 1 rollout devices"):
        ProcessSync(on(0, 0, 0), on(1), None)
