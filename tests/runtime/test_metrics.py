"""Metrics logging: metrics.jsonl and TensorBoard show each epoch once, also after a resume."""

import json
import struct
from pathlib import Path

from jaxcore.runtime.metrics import MetricsLogger


def tensorboard_events(folder: Path) -> list:
    """Every event of every event file under `folder` (TFRecord framing, read without TensorFlow)."""
    from tensorboardX.proto import event_pb2

    events = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12:offset + 12 + length])
            events.append(event)
            offset += 12 + length + 4
    return events


def test_a_resumed_log_drops_the_epochs_it_runs_again(tmp_path):
    """Epochs 1-4 logged, the run resumed after epoch 2: metrics.jsonl keeps 1-2, and TensorBoard is told to
    purge the earlier events from step 3 on (a SessionLog START at step 3), so re-run epochs show once."""
    first = MetricsLogger(tmp_path, tensorboard=True)
    for step in range(1, 5):
        first.log(step, {"reward": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, tensorboard=True, resume_after=2)
    for step in (3, 4):
        resumed.log(step, {"reward": 10.0 + step})
    resumed.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    purges = [e.step for e in tensorboard_events(tmp_path / "tensorboard")
              if e.HasField("session_log") and e.session_log.status == e.session_log.START]
    assert purges == [3]


def test_a_truncated_last_line_is_dropped_with_a_warning_on_resume(tmp_path, caplog):
    """What a crash or a full disk leaves (a last line cut mid-record) is dropped with a warning, not a traceback."""
    complete = [json.dumps({"step": s, "reward": 0.5}) for s in (0, 1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(complete) + '\n{"step": 3, "rew')
    logger = MetricsLogger(tmp_path, tensorboard=False, resume_after=2)
    logger.log(3, {"reward": 0.75})
    logger.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    assert "dropping its last line, which is incomplete" in caplog.text


def test_a_bad_line_before_the_last_is_one_line_and_changes_nothing(tmp_path):
    import pytest

    from jaxcore.errors import TrainingError

    text = '{"step": 0}\nnot json\n{"step": 1}\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(TrainingError, match=r"metrics.jsonl:2: not a JSON object"):
        MetricsLogger(tmp_path, tensorboard=False, resume_after=1)
    assert (tmp_path / "metrics.jsonl").read_text() == text
