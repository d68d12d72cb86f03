"""Asynchronous GRPO in one process (issue 53) on 8 simulated devices, 4 generating and 4 training: lag 0 is the
synchronous run bit for bit, a stopped and resumed run is the straight one, weight syncs are counted (every weight
once per sync, device to device), and every step logs its waits, its sync and TRL's staleness."""

import json
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from cli_runs import final_params, grpo_args, run_cli

from jaxcore.grpo.algorithm import GRPOAlgorithm
from jaxcore.grpo.async_rollout import Job, RolloutWorker
from jaxcore.grpo.async_weights import WeightSync
from jaxcore.hf.convert import read_safetensors
from jaxcore.parallel import meshes

ASYNC_METRICS = ("async/trainer_wait_s", "async/rollout_wait_s", "async/weight_sync_s", "async/weight_sync_wait_s",
                 "async/weight_syncs", "async/weight_transfers", "sample/staleness_mean", "sample/staleness_max",
                 "ratio")
COMMON = ["train.eval_every=-1", "optimizer.schedule=constant"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_run(a: Path, b: Path) -> None:
    """Two runs' final weights bit for bit, and their logged losses and rewards."""
    pa, pb = final_params(a), final_params(b)
    for key in pa:
        np.testing.assert_array_equal(pb[key], pa[key], err_msg=key)
    for x, y in zip(records(a), records(b), strict=True):
        keys = ("step", "loss", "reward", "grad_norm")
        assert [x[k] for k in keys] == [y[k] for k in keys]


def test_lag_zero_equals_the_synchronous_run_bit_for_bit(tiny_dir, tmp_path, capsys, monkeypatch):
    """max_staleness 0 and a sync every step: batch k is generated from the weights after step k - 1, on the other
    four devices, and trained with the async loss at ratio 1: the synchronous run (num_iterations 1) on the same
    four training devices, generating there."""
    model = tiny_dir("llama")
    asynchronous, synchronous = tmp_path / "async", tmp_path / "sync"
    code, err = run_cli(capsys, "grpo", *grpo_args(model, asynchronous, "train.epochs=3", *COMMON,
                                                   "grpo.asynchronous.max_staleness=0"))
    assert code == 0, err
    monkeypatch.setattr(GRPOAlgorithm, "training_devices", lambda self: jax.devices()[:4])
    assert run_cli(capsys, "grpo", *grpo_args(model, synchronous, "train.epochs=3", *COMMON))[0] == 0
    same_run(synchronous, asynchronous)
    assert any(not np.array_equal(a, b) for a, b in zip(final_params(asynchronous).values(),
                                                         read_safetensors(model).values()))
    rows = records(asynchronous)
    assert [r["sample/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]
    assert [r["ratio"] for r in rows] == [1.0, 1.0, 1.0]


def test_lag_zero_with_a_token_budget_equals_the_synchronous_run(tiny_dir, tmp_path, capsys, monkeypatch):
    """grpo.token_budget (TRL AsyncGRPO's: rows of that many slots, a group split over rows where it does not fit)
    with the asynchronous runner at lag 0: the synchronous run with the same budget, on the same four training
    devices, bit for bit. The rollout devices are named (4 of 8): the training mesh's rows are checked against its
    4 devices, not the whole layout again (which refused it: no device left to train among 4)."""
    model = tiny_dir("llama")
    budget = ["grpo.token_budget=24", "train.epochs=3", *COMMON]
    asynchronous, synchronous = tmp_path / "async", tmp_path / "sync"
    code, err = run_cli(capsys, "grpo", *grpo_args(model, asynchronous, *budget, "grpo.asynchronous.max_staleness=0",
                                                   "grpo.asynchronous.rollout_devices=4"))
    assert code == 0, err
    monkeypatch.setattr(GRPOAlgorithm, "training_devices", lambda self: jax.devices()[:4])
    code, err = run_cli(capsys, "grpo", *grpo_args(model, synchronous, *budget))
    assert code == 0, err
    same_run(synchronous, asynchronous)
    assert [r["ratio"] for r in records(asynchronous)] == [1.0, 1.0, 1.0]


def test_lag_zero_with_fsdp_equals_the_synchronous_fsdp_run(tiny_dir, tmp_path, capsys, monkeypatch):
    """grpo.fsdp=2 over the 4 training devices: the weights train sharded, every sync moves their shards to the
    rollout devices and gathers them there; at lag 0 the synchronous FSDP run on the same devices, bit for bit."""
    model = tiny_dir("llama")
    common = ["train.epochs=3", "grpo.fsdp=2", *COMMON]
    pushed = []
    copy = WeightSync._copy

    def recorded(self, params, then):
        pushed.append(sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(params)))
        copied = copy(self, params, then)
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(copied))
        return copied

    monkeypatch.setattr(WeightSync, "_copy", recorded)
    asynchronous, synchronous = tmp_path / "async", tmp_path / "sync"
    code, err = run_cli(capsys, "grpo", *grpo_args(model, asynchronous, *common, "grpo.asynchronous.max_staleness=0",
                                                   "grpo.asynchronous.rollout_devices=4"))
    assert code == 0, err
    assert len(pushed) == 3 and min(pushed) > 0             # one sync per step, of sharded weights
    monkeypatch.setattr(GRPOAlgorithm, "training_devices", lambda self: jax.devices()[:4])
    assert run_cli(capsys, "grpo", *grpo_args(model, synchronous, *common))[0] == 0
    same_run(synchronous, asynchronous)


def test_the_trainer_steps_on_while_a_weight_sync_runs(tiny_dir, tmp_path, capsys, monkeypatch):
    """max_staleness 2: batch 1 is version 0's, so the trainer's second step needs nothing from the first sync
    (version 1, after step 1). That sync's copy is held until the second step has run: the trainer takes it meanwhile
    (it waited for the copy, which waited for it: the run hung, here until the hold gave up)."""
    from jaxcore.grpo.learner import GRPOLearner

    steps, second_step = [], threading.Event()
    step = GRPOLearner.step

    def counted(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        steps.append(len(steps) + 1)
        if len(steps) == 2:
            second_step.set()
        return out

    held = []
    place = WeightSync.place

    def held_first_sync(self, tree):
        if steps and not held:                  # the first copy after a step: the first sync's
            held.append(second_step.wait(timeout=180))
        return place(self, tree)

    monkeypatch.setattr(GRPOLearner, "step", counted)
    monkeypatch.setattr(WeightSync, "place", held_first_sync)
    out = tmp_path / "async"
    code, err = run_cli(capsys, "grpo", *grpo_args(tiny_dir("llama"), out, "train.epochs=4", *COMMON,
                                                   "grpo.asynchronous.max_staleness=2"))
    assert code == 0, err
    assert held == [True], "the second step waited for the first weight sync"
    assert [r["async/weight_syncs"] for r in records(out)] == [1, 2, 3, 4]
    assert [r["sample/staleness_max"] for r in records(out)] == [0.0, 1.0, 2.0, 2.0]


def test_a_failed_weight_sync_is_raised_where_the_trainer_waits():
    """A batch whose weights never come (their sync failed) raises the sync's error instead of waiting forever."""
    worker = RolloutWorker(lambda weights, job: job.batch)
    try:
        worker.publish(0, "v0")
        worker.submit(Job(0, 0, None))
        worker.submit(Job(1, 1, None))
        assert worker.result(0) == 0
        worker.fail(RuntimeError("the copy ran out of memory"))
        with pytest.raises(RuntimeError, match="ran out of memory"):
            worker.result(1)
    finally:
        worker.close()


def test_a_resumed_run_equals_the_straight_one(tiny_dir, tmp_path, capsys):
    """max_staleness 1, a sync every 2 steps: stopped after 3 steps (between syncs: batch 3 of version 0 is stored as
    generated, version 1's weights beside the train state, batches 4 and 5 generated again), then resumed."""
    model = tiny_dir("llama")
    common = [*COMMON, "train.checkpoint_every=1", "grpo.asynchronous.max_staleness=1",
              "grpo.asynchronous.weight_sync_steps=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli(capsys, "grpo", *grpo_args(model, straight, "train.epochs=6", *common))[0] == 0
    assert run_cli(capsys, "grpo", *grpo_args(model, resumed, "train.epochs=3", *common))[0] == 0
    assert run_cli(capsys, "grpo", "--resume", *grpo_args(model, resumed, "train.epochs=6", *common))[0] == 0
    same_run(straight, resumed)
    rows = records(straight)
    for row in rows:
        assert all(k in row for k in ASYNC_METRICS), [k for k in ASYNC_METRICS if k not in row]
        assert row["async/trainer_wait_s"] >= 0 and row["async/rollout_wait_s"] >= 0
    # versions: batches 0-3 from version 0, 4-5 from version 1; the trainer at version step // 2
    assert [r["sample/staleness_max"] for r in rows] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert [r["async/weight_syncs"] for r in rows] == [0, 1, 1, 2, 2, 3]          # one per 2 steps
    leaves = rows[1]["async/weight_transfers"]
    assert leaves > 0 and [r["async/weight_transfers"] for r in rows] == [s * leaves for s in (0, 1, 1, 2, 2, 3)]


def test_a_resumed_fsdp_run_equals_the_straight_one(tiny_dir, tmp_path, capsys):
    """grpo.fsdp=2 over the 4 training devices, max_staleness 1, a sync every 2 steps: stopped after 3 steps (its
    sharded train state and the newest version's weights in the checkpoint, a batch stored as generated), then
    resumed: the straight run bit for bit."""
    model = tiny_dir("llama")
    common = [*COMMON, "train.checkpoint_every=1", "grpo.fsdp=2", "grpo.asynchronous.rollout_devices=4",
              "grpo.asynchronous.max_staleness=1", "grpo.asynchronous.weight_sync_steps=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli(capsys, "grpo", *grpo_args(model, straight, "train.epochs=5", *common))[0] == 0
    assert run_cli(capsys, "grpo", *grpo_args(model, resumed, "train.epochs=3", *common))[0] == 0
    assert run_cli(capsys, "grpo", "--resume", *grpo_args(model, resumed, "train.epochs=5", *common))[0] == 0
    same_run(straight, resumed)
    assert [r["async/weight_syncs"] for r in records(resumed)] == [0, 1, 1, 2, 2]


def test_a_weight_sync_moves_every_weight_once_device_to_device(monkeypatch):
    """Replicated training weights land replicated on the rollout devices with no array read back to the host."""
    from jax._src.array import ArrayImpl

    devices = jax.devices()
    train, rollout = meshes.grpo_mesh(1, devices[:4]), meshes.grpo_mesh(1, devices[4:])
    params = {"a": np.arange(12.0, dtype=np.float32).reshape(3, 4), "b": {"c": np.ones(5, np.int32)}}
    placed = jax.device_put(params, meshes.replicated(train))
    sync = WeightSync(rollout)

    def no_host(self):
        raise AssertionError("a weight went through the host")

    monkeypatch.setattr(ArrayImpl, "_value", property(no_host))
    copies = [sync.start(placed).result() for _ in range(2)]
    monkeypatch.undo()
    assert (sync.syncs, sync.transfers) == (2, 2 * 2)          # two weights, each once per sync
    for copy in copies:
        for x, y in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
            assert x.sharding.device_set == set(devices[4:]) and x.sharding.is_fully_replicated
            np.testing.assert_array_equal(np.asarray(x), y)


def test_an_fsdp_sharded_weight_moves_shard_by_shard_and_is_gathered_on_the_rollout_devices(monkeypatch):
    """grpo.fsdp: a weight sharded over the training devices is copied shard by shard to the rollout devices (laid
    out as the training mesh), then gathered there; no array is read back to the host, and each weight counts once."""
    from jax._src.array import ArrayImpl

    devices = jax.devices()
    train, rollout = meshes.grpo_mesh(2, devices[:4]), meshes.grpo_mesh(1, devices[4:])
    params = {"w": np.arange(32.0, dtype=np.float32).reshape(8, 4), "b": np.ones(3, np.float32)}
    placed = {"w": jax.device_put(params["w"], jax.sharding.NamedSharding(train, jax.sharding.PartitionSpec("fsdp"))),
              "b": jax.device_put(params["b"], meshes.replicated(train))}
    assert not placed["w"].sharding.is_fully_replicated
    sync = WeightSync(rollout)

    def no_host(self):
        raise AssertionError("a weight went through the host")

    monkeypatch.setattr(ArrayImpl, "_value", property(no_host))
    copy = sync.start(placed).result()
    monkeypatch.undo()
    assert (sync.syncs, sync.transfers) == (1, 2)
    for key, x in copy.items():
        assert x.sharding.device_set == set(devices[4:]) and x.sharding.is_fully_replicated
        np.testing.assert_array_equal(np.asarray(x), params[key])


def test_a_batch_being_generated_is_held():
    """A batch the worker is generating counts as held, so the algorithm never queues it again: at max_staleness 2
    such a second job could queue behind a newer version's batch, which lets its version go, and then wait for those
    weights forever (the run hung)."""
    started, release = threading.Event(), threading.Event()

    def generate(weights, job):
        started.set()
        release.wait()
        return job.batch, weights

    worker = RolloutWorker(generate)
    try:
        worker.publish(0, "v0")
        worker.submit(Job(0, 0, None))
        assert started.wait(60)
        assert worker.holds(0) and not worker.holds(1)
        release.set()
        assert worker.result(0) == (0, "v0") and worker.holds(0)
        worker.forget(0)
        assert not worker.holds(0) and worker.generated == 1
    finally:
        release.set()
        worker.close()


def test_a_sharded_weight_is_refused_between_groups_of_other_sizes():
    devices = jax.devices()
    train = meshes.grpo_mesh(1, devices[:4])
    sharded = jax.device_put(np.zeros((4, 2), np.float32), meshes.leading_axis(train, "data"))
    with pytest.raises(ValueError, match="without a host round trip"):
        WeightSync(meshes.grpo_mesh(1, devices[5:])).start({"w": sharded}).result()


def test_free_running_trains_only_batches_within_max_staleness(tiny_dir, tmp_path, capsys):
    """TRL's free-running mode: each batch takes the newest weights when its generation starts and one staler than
    max_staleness when its turn comes is dropped (counted); what is trained is never staler, and the data position
    (the next batch) moves past the drops. Timing decides which batches those are: no run is compared bit for bit."""
    model = tiny_dir("llama")
    out = tmp_path / "free"
    overrides = [*COMMON, "train.checkpoint_every=1", "grpo.asynchronous.mode=free_running",
                 "grpo.asynchronous.max_staleness=0"]
    code, err = run_cli(capsys, "grpo", *grpo_args(model, out, "train.epochs=3", *overrides))
    assert code == 0, err
    rows = records(out)
    assert [r["sample/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]
    drops = [r["sample/dropped_stale_total"] for r in rows]
    assert drops == sorted(drops) and all(r["async/batch"] == r["step"] - 1 + d for r, d in zip(rows, drops))
    # at max_staleness 0 each batch is queued after the sync before it and takes its weights: none is dropped (it
    # took the older version, and was dropped, when it started while those weights were still being copied)
    assert drops == [0, 0, 0]
    assert [r["async/weight_syncs"] for r in rows] == [1, 2, 3]
    assert run_cli(capsys, "grpo", "--resume", *grpo_args(model, out, "train.epochs=4", *overrides))[0] == 0
    resumed = records(out)[-1]
    assert resumed["step"] == 4 and resumed["sample/staleness_max"] == 0.0
    assert resumed["async/batch"] >= rows[-1]["async/batch"] + 1
