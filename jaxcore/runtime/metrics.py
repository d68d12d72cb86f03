"""Training metrics: JSONL (always), TensorBoard (tensorboardX), and a reward plot at the end."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from jaxcore.errors import TrainingError
from jaxcore.outputs import open_output, refuse_special, translated_os_errors

log = logging.getLogger(__name__)


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
        self.path = self.out_dir / "metrics.jsonl"
        with translated_os_errors(self.path):
            self._open(resume_after, tensorboard)

    def _open(self, resume_after: int | None, tensorboard: bool) -> None:
        """Keep the records up to `resume_after` (none: start afresh), open the log and the TensorBoard writer."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        refuse_special(self.path, "train.out_dir's metrics.jsonl", "move it away, or choose another train.out_dir")
        if resume_after is not None and self.path.is_file():
            kept = [line for line, record in _records(self.path) if record.get("step", -1) <= resume_after]
            with open_output(self.path, overwrite=True, name="metrics") as handle:    # all or nothing
                handle.write("".join(line + "\n" for line in kept))
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
        with translated_os_errors(self.path):                 # a full disk: one line, not a traceback
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


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for every line of a metrics file. A last line that is not a complete JSON object (what a
    crash or a full disk leaves) is dropped with a warning; a bad line before it is a one-line `TrainingError`
    (something other than jaxcore wrote it: nothing is dropped)."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    out = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            if number == len(lines):
                log.warning("%s: dropping its last line, which is incomplete (%s): %.60s", path, err, line)
                break
            raise TrainingError(f"{path}:{number}: not a JSON object ({err}); fix or remove that line") from None
        out.append((line, record))
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (an incomplete last line dropped with a warning)."""
    return [record for _, record in _records(Path(path))]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def import_plotting_beside() -> threading.Thread:
    """Import matplotlib on a background thread (most of a reward plot's second, done while the run's programs
    run and the interpreter lock is free), so that the plot at the end of a run does not wait for it."""
    def load() -> None:
        try:
            _pyplot()
        except Exception:  # noqa: BLE001 -- plot_rewards imports it again and reports any error itself
            pass
    thread = threading.Thread(target=load, name="jaxcore-import-matplotlib", daemon=True)
    thread.start()
    return thread


def plot_rewards(metrics_path: str | Path, png_path: str | Path, title: str = "reward") -> Path:
    """Train and held-out reward against the step, as a PNG written whole or not at all (`open_output`: never
    through or over a named pipe or a device, one line for a full disk)."""
    plt = _pyplot()

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
    try:
        with open_output(png_path, "wb", overwrite=True, name="train.out_dir's reward.png") as handle:
            fig.savefig(handle, format="png", dpi=120)
    finally:
        plt.close(fig)
    return Path(png_path)
