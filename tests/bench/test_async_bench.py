"""`jaxcore bench --suite async` (issue 53): the suite end to end on the tiny model with quick shapes (a synchronous
and an asynchronous run on 8 simulated devices, each in its own process), and the overlap as a pure function of
known intervals. No timed assertions."""

from __future__ import annotations

import pytest

from jaxcore.bench import BenchOptions, async_overlap
from jaxcore.bench.timeline import both, covered, merged, overlap_figures
from jaxcore.cli import main


def test_the_suite_reports_both_runs(tmp_path):
    results = async_overlap.run(BenchOptions(quick=True, workdir=str(tmp_path), max_staleness=(1,)))
    assert results["async.settings"]["steps"] == 3 and results["async.settings"]["max_staleness"] == [1]
    assert async_overlap.settings(BenchOptions())["max_staleness"] == [2]      # the default
    for name in ("sync", "staleness_1"):
        assert results[f"async.{name}.tokens_per_s"] > 0 and results[f"async.{name}.steps"] == 3
        assert len(results[f"async.{name}.load_average"]) == 2
        assert results[f"async.{name}.compile_s_first_step"] >= 0
    assert 0 <= results["async.sync.generation_share"] <= 1
    a = "async.staleness_1"
    for key in ("overlap_share", "generation_busy_share", "training_busy_share", "rollout_idle_share",
                "trainer_idle_share", "trainer_wait_share", "rollout_wait_share"):
        assert 0 <= results[f"{a}.{key}"] <= 1, key
    assert results[f"{a}.overlap_share"] <= min(results[f"{a}.generation_busy_share"],
                                                results[f"{a}.training_busy_share"])
    assert results[f"{a}.weight_syncs"] == 3 and results[f"{a}.weight_sync_s_mean"] > 0     # one per step
    # every batch's generation and every trainer step are on the timeline: batch 2 (version 1, published after
    # step 0) starts generating once step 0's training has ended
    timeline = results[f"{a}.timeline"]
    assert len(timeline["generation"]) == len(timeline["training"]) == 3
    assert timeline["generation"][2][0] >= timeline["training"][0][1]
    assert results[f"{a}.staleness_mean"] == round(2 / 3, 3)             # staleness 0, 1, 1
    if results["async.timeline_png"] is not None:                          # None without matplotlib
        assert (tmp_path / "async_timeline.png").is_file()


def test_overlap_of_known_intervals():
    """Three batches generated back to back, each trained as the next one generates: the window runs from the end
    of the first generation (2) to the end of the last step (7.5); both ran over [2, 3.5] and [4, 5.5]."""
    generation = [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]
    training = [(2.0, 3.5), (4.0, 5.5), (6.0, 7.5)]
    got = overlap_figures(generation, training)
    assert got["window_s"] == 5.5
    assert got["overlap_share"] == pytest.approx(3.0 / 5.5)
    assert got["generation_busy_share"] == pytest.approx(4.0 / 5.5)
    assert got["training_busy_share"] == pytest.approx(4.5 / 5.5)
    assert got["rollout_idle_share"] == pytest.approx(1.5 / 5.5)
    assert got["trainer_idle_share"] == pytest.approx(1.0 / 5.5)


def test_overlap_counts_each_second_once():
    """Intervals of one side that overlap each other (or touch) count once; the window cuts what lies outside it."""
    assert merged([(3.0, 4.0), (0.0, 2.0), (1.0, 3.0), (5.0, 5.0)]) == [(0.0, 4.0)]
    assert merged([(0.0, 2.0), (3.0, 6.0)], start=1.0, end=4.0) == [(1.0, 2.0), (3.0, 4.0)]
    assert covered([(0.0, 2.0), (1.0, 3.0)], 0.0, 10.0) == 3.0
    assert both([(0.0, 2.0), (1.0, 3.0)], [(2.5, 4.0), (0.5, 1.0)], 0.0, 10.0) == pytest.approx(1.0)
    assert both([(0.0, 10.0)], [(2.0, 3.0), (5.0, 7.0)], 2.5, 6.0) == pytest.approx(1.5)
    # the trainer never waits and generation always runs: all of the window
    full = overlap_figures([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)], [(1.0, 2.0), (2.0, 3.0)])
    assert full["overlap_share"] == 1.0 and full["trainer_idle_share"] == 0.0
    # strictly alternating (the synchronous shape): no overlap at all
    assert overlap_figures([(0.0, 1.0), (2.0, 3.0)], [(1.0, 2.0), (3.0, 4.0)])["overlap_share"] == 0.0


def test_async_options_are_one_line(capsys):
    assert main(["bench", "--suite", "async", "--max-staleness", "1,x"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-staleness must be a comma list of integers" in err[0]
