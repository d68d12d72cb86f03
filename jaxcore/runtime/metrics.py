"""Training metrics: JSONL (always), TensorBoard (tensorboardX), and a reward plot at the end."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Appends one JSON object per step to `metrics.jsonl` and mirrors scalars to TensorBoard."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True, resume_after: int | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        if resume_after is not None and self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", -1) <= resume_after]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resume_after is None and self.path.is_file():
            self.path.unlink()
        self._file = self.path.open("a")
        self._writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            # On resume, TensorBoard drops the earlier events from the first re-run step on (`purge_step`), so
            # epochs run again after an interruption show once, as in metrics.jsonl.
            purge = None if resume_after is None else resume_after + 1
            self._writer = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=purge)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_rewards(metrics_path: str | Path, png_path: str | Path, title: str = "reward") -> Path:
    """Train and held-out reward against the step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("reward", "train reward"), ("eval/reward", "held-out reward")):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return Path(png_path)
