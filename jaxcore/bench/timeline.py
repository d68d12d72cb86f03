"""A run's timeline of generation and training intervals (asynchronous GRPO, `jaxcore bench --suite async`): how
much of the wall time each side was busy and how much both were at once. Pure functions of (start, end) pairs;
the PNG only where matplotlib is installed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

Interval = tuple[float, float]


def merged(intervals: Sequence[Interval], start: float = float("-inf"), end: float = float("inf")) -> list[Interval]:
    """The union of `intervals` cut to [start, end], as sorted disjoint intervals (empty ones dropped)."""
    cut = sorted((max(a, start), min(b, end)) for a, b in intervals)
    out: list[Interval] = []
    for a, b in cut:
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covered(intervals: Sequence[Interval], start: float, end: float) -> float:
    """Seconds of [start, end] inside at least one of `intervals`."""
    return sum(b - a for a, b in merged(intervals, start, end))


def both(first: Sequence[Interval], second: Sequence[Interval], start: float, end: float) -> float:
    """Seconds of [start, end] inside one of `first` and one of `second` at once."""
    a, b = merged(first, start, end), merged(second, start, end)
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_figures(generation: Sequence[Interval], training: Sequence[Interval]) -> dict[str, float]:
    """The window after the first batch (from the end of the first generation to the end of the last training
    step) and, as shares of it: the time generation and training both ran (`overlap_share`), each side's busy
    time and its idle time."""
    start, end = min(b for _, b in generation), max(b for _, b in training)
    window = end - start
    if window <= 0:
        raise ValueError(f"no time after the first batch: the first generation ends at {start}, the last training "
                         f"step at {end}")
    gen, train = covered(generation, start, end) / window, covered(training, start, end) / window
    return {"window_s": window, "overlap_share": both(generation, training, start, end) / window,
            "generation_busy_share": gen, "training_busy_share": train,
            "rollout_idle_share": 1.0 - gen, "trainer_idle_share": 1.0 - train}


def plot_timeline(lanes: dict[str, dict[str, Sequence[Interval]]], png: Path) -> str | None:
    """One panel per run ({run: {lane: intervals}}), a row of bars per lane (generation, training); the PNG's path
    (None when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    colors = {"generation": "tab:orange", "training": "tab:blue"}
    fig, axes = plt.subplots(len(lanes), 1, figsize=(10, 1.6 * len(lanes) + 0.6), squeeze=False)
    for ax, (run, runs) in zip(axes[:, 0], lanes.items()):
        for row, (lane, intervals) in enumerate(runs.items()):
            bars: list[Any] = [(a, b - a) for a, b in intervals]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=colors.get(lane, "tab:gray"), edgecolor="white")
        ax.set_yticks(range(len(runs)), list(runs))
        ax.set(title=run, xlabel="seconds since the process started")
        ax.grid(axis="x", alpha=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return str(png)
