"""The deterministic asynchronous schedule: which version generates each batch, staleness within TRL's bound, the
overlap it leaves the rollout devices, and a checkpoint plan under which a resumed run equals a straight one
(simulated with weights that are a hash of everything trained)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from jaxcore.grpo.async_schedule import Schedule, fresh

SETTINGS = [(lag, sync) for lag in (0, 1, 2, 4) for sync in (1, 2, 3)]


def test_lag_zero_with_a_sync_every_step_is_the_synchronous_run():
    s = Schedule(max_staleness=0, weight_sync_steps=1)
    assert [s.generation_version(k) for k in range(6)] == list(range(6))      # batch k from the weights after k
    assert all(s.staleness(k) == 0 for k in range(6))
    assert [list(s.generatable(c)) for c in range(3)] == [[0], [1], [2]]      # nothing to generate ahead: no overlap
    assert all(s.on_policy(k) for k in range(6))                              # the ratio is 1: the synchronous loss


def test_by_hand():
    s = Schedule(max_staleness=1, weight_sync_steps=2)
    assert [s.generation_version(k) for k in range(8)] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert [s.staleness(k) for k in range(8)] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert list(s.batches_of(0)) == [0, 1, 2, 3] and list(s.batches_of(1)) == [4, 5]
    assert s.published_after(1) == 2 and list(s.generatable(2)) == [2, 3, 4, 5]
    assert [k for k in range(8) if s.on_policy(k)] == [0]                    # the first step's batch only
    assert [k for k in range(6) if Schedule(0, 2).on_policy(k)] == [0, 2, 4]  # lag 0: the batches at a sync


@pytest.mark.parametrize("lag, sync", SETTINGS)
def test_staleness_is_within_max_staleness_and_every_batch_s_weights_exist_before_its_step(lag, sync):
    s = Schedule(lag, sync)
    for k in range(60):
        assert 0 <= s.staleness(k) <= lag
        assert s.published_after(s.generation_version(k)) <= k            # published before step k trains
        assert s.generation_version(k) <= s.generation_version(k + 1)      # versions only move forward
        if k >= (lag + 1) * sync:
            assert s.staleness(k) == lag                                   # after the start: exactly the lag
    versions = [s.generation_version(k) for k in range(60)]
    covered = [k for v in range(max(versions) + 1) for k in s.batches_of(v)]
    assert covered[:60] == list(range(60))                                 # each version's batches in order


@pytest.mark.parametrize("lag, sync", [(lag, sync) for lag, sync in SETTINGS if lag >= 1])
def test_with_a_lag_the_rollout_always_has_a_batch_to_generate_while_a_step_trains(lag, sync):
    s = Schedule(lag, sync)
    for step in range(50):
        ahead = [k for k in s.generatable(step) if k > step]
        assert ahead, step                                                 # generation overlaps this step
        assert len(s.generatable(step)) <= (lag + 1) * sync                # bounded: at most L + 1 versions' worth


def weights_after(trained: list[str]) -> str:
    return hashlib.sha256("|".join(trained).encode()).hexdigest()[:12]


def generate(k: int, weights: str) -> str:
    return f"batch{k}@{weights}"


def straight(s: Schedule, steps: int) -> list[str]:
    """Every batch generated from its version's weights and trained in order."""
    trained: list[str] = []
    snapshots = {0: weights_after([])}
    for k in range(steps):
        batch = generate(k, snapshots[s.generation_version(k)])
        trained.append(batch)
        if (k + 1) % s.weight_sync_steps == 0:
            snapshots[s.trainer_version(k + 1)] = weights_after(trained)
    return trained


@pytest.mark.parametrize("lag, sync", SETTINGS)
def test_a_run_resumed_by_the_checkpoint_plan_equals_the_straight_one(lag, sync):
    s = Schedule(lag, sync)
    steps = 24 + (lag + 1) * sync                  # the batches in flight at the last checkpoint are trained too
    reference = straight(s, steps)
    for stop in range(1, 24):
        plan = s.checkpoint_plan(stop)
        # the checkpoint: the train state (everything trained), the stored batches as generated, the rollout's
        # weights when they are not the trained ones
        state = list(reference[:stop])
        stored = {k: reference[k] for k in plan.stored}
        rollout = None
        if plan.rollout_weights:
            rollout = weights_after(reference[:s.published_after(plan.version)])
        # resume: regenerate the newest version's batches from its weights, then go on as the straight run
        version_weights = rollout if plan.rollout_weights else weights_after(state)
        assert version_weights == weights_after(reference[:s.published_after(plan.version)])
        pending = {**stored, **{k: generate(k, version_weights) for k in plan.regenerated}}
        assert set(pending) == set(s.generatable(stop))
        trained = state
        snapshots = {plan.version: version_weights}
        for k in range(stop, steps):
            batch = pending[k] if k in pending else generate(k, snapshots[s.generation_version(k)])
            trained.append(batch)
            if (k + 1) % sync == 0:
                snapshots[s.trainer_version(k + 1)] = weights_after(trained)
        assert trained == reference, stop


def test_a_checkpoint_at_a_sync_boundary_needs_no_extra_weights():
    s = Schedule(max_staleness=1, weight_sync_steps=2)
    assert not s.checkpoint_plan(4).rollout_weights and s.checkpoint_plan(5).rollout_weights
    plan = s.checkpoint_plan(4)                      # version 2 published; batches 4, 5 are version 1's, 6, 7 are 2's
    assert (plan.version, plan.stored, plan.regenerated) == (2, (4, 5), (6, 7))


def test_free_running_drops_samples_staler_than_the_bound_as_trl():
    keep, dropped = fresh(7, np.array([7, 6, 3, 2, 5]), max_staleness=4)
    assert keep.tolist() == [True, True, True, False, True] and dropped == 1


def test_an_impossible_schedule_is_one_line():
    with pytest.raises(ValueError, match="max_staleness >= 0 and weight_sync_steps >= 1"):
        Schedule(max_staleness=-1)
