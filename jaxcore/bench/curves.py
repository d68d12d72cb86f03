"""Reward against wall-clock seconds, both sides of a comparison, every run: what a user of either waits for."""

from __future__ import annotations

from pathlib import Path

COLORS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def plot_reward_vs_time(curves: dict[str, dict[str, list[list[list[float]]]]], png: Path, labels: dict[str, str],
                        title_prefix: str = "", xlabel: str = "seconds since the run started") -> str | None:
    """One panel per key of `curves` ({key: {side: [[times, rewards], ...]}}), a line per run (no smoothing), the
    sides named by `labels` ({side: label}, the first side in orange, the second in blue, then `COLORS`' others);
    the PNG's path (None when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (key, sides) in zip(axes[0], curves.items()):
        for (side, label), color in zip(labels.items(), COLORS):
            for i, (times, rewards) in enumerate(sides[side]):
                ax.plot(times, rewards, marker=".", color=color, alpha=0.8, label=label if i == 0 else None)
        ax.set(title=key.removeprefix(title_prefix), xlabel=xlabel, ylabel="mean reward")
        ax.grid(alpha=0.3)
        ax.legend()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return str(png)
