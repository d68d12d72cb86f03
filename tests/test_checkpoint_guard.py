"""Resume that never costs a run: corrupt checkpoints fall back, config drift is refused, one run per
out_dir, a full disk keeps the last good checkpoint. Driven through `jaxcore es` on a tiny model."""

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_runtime import es_args, run_cli

FAST = ["train.checkpoint_every=1", "train.eval_every=0", "train.export_hf=false"]


@pytest.fixture(scope="module")
def two_checkpoints(tiny_dir, tmp_path_factory) -> Path:
    """An out_dir holding checkpoints of epochs 0 and 1 (a 2-epoch run)."""
    from jaxcore.cli import main

    out = tmp_path_factory.mktemp("base") / "out"
    assert main(["es", *es_args(tiny_dir("llama"), out, "train.epochs=2", *FAST)]) == 0
    return out


@pytest.fixture
def out(two_checkpoints, tmp_path) -> Path:
    """A private copy of the two-checkpoint out_dir."""
    return Path(shutil.copytree(two_checkpoints, tmp_path / "out"))


def resume(capsys, tiny_dir, out: Path, *extra: str):
    return run_cli(capsys, "es", "--resume", *es_args(tiny_dir("llama"), out, "train.epochs=3", *FAST, *extra))


def ckpt(out: Path) -> Path:
    return out / "checkpoints"


def corrupt_meta(step_dir: Path) -> None:
    meta = step_dir / "meta" / "metadata"
    meta.write_text(meta.read_text()[:20])


def truncate_arrays(step_dir: Path) -> None:
    for f in (step_dir / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def started_from(out: Path) -> list[int]:
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    return steps


@pytest.mark.parametrize("damage", [corrupt_meta, truncate_arrays, lambda d: shutil.rmtree(d / "state")],
                         ids=["bad-meta-json", "truncated-arrays", "missing-arrays"])
def test_bad_latest_checkpoint_falls_back_to_the_previous_one(tiny_dir, out, capsys, caplog, damage):
    damage(ckpt(out) / "1")
    code, err = resume(capsys, tiny_dir, out)
    assert code == 0, err
    warnings = [r.getMessage() for r in caplog.records if "does not restore" in r.getMessage()]
    assert len(warnings) == 1 and "step 1" in warnings[0] and "\n" not in warnings[0]
    aside = list((out / "checkpoints-corrupt").iterdir())
    assert len(aside) == 1 and aside[0].name.startswith("1.corrupt-")      # kept, not deleted
    assert sorted(p.name for p in ckpt(out).iterdir() if p.name.isdigit())[-1] == "2"
    assert started_from(out)[-1] == 3                       # epoch 2 (step 3) was run after resuming at 1


def test_no_restorable_checkpoint_is_one_line_and_exit_2(tiny_dir, out, capsys):
    corrupt_meta(ckpt(out) / "1")
    truncate_arrays(ckpt(out) / "0")
    code, err = resume(capsys, tiny_dir, out)
    assert code == 2 and len(err) == 1 and "none of the checkpoints [1, 0] restores" in err[0]
    assert len(list((out / "checkpoints-corrupt").iterdir())) == 2


@pytest.mark.parametrize("override,field", [("es.population=8", "es.population"), ("es.sigma=0.5", "es.sigma"),
                                            ("train.seed=7", "train.seed")])
def test_incompatible_config_is_refused_naming_the_field(tiny_dir, out, capsys, override, field):
    before = sorted(str(p) for p in ckpt(out).rglob("*"))
    code, err = resume(capsys, tiny_dir, out, override)
    assert code == 2 and len(err) == 1 and field in err[0] and "--resume-allow-changes" in err[0]
    assert sorted(str(p) for p in ckpt(out).rglob("*")) == before       # nothing moved or written


def test_allow_changes_and_harmless_changes_resume(tiny_dir, out, capsys, caplog):
    caplog.set_level(logging.INFO, logger="jaxcore.run_guard")
    code, err = run_cli(capsys, "es", "--resume", "--resume-allow-changes",
                        *es_args(tiny_dir("llama"), out, "train.epochs=3", *FAST, "es.sigma=0.5"))
    assert code == 0, err
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "es.sigma" in logged and "train.epochs: 2 -> 3" in logged


def test_a_second_run_on_a_locked_out_dir_is_refused(tiny_dir, out, capsys):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".lock").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        code, err = resume(capsys, tiny_dir, out)
        assert code == 2 and len(err) == 1 and "in use by another run" in err[0] and str(sleeper.pid) in err[0]
        assert (out / ".lock").exists()                    # the owner's lock is left alone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_lock_is_taken_over_and_released(tiny_dir, out, capsys, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    code, err = resume(capsys, tiny_dir, out)
    assert code == 0, err
    assert any("stale lock" in r.getMessage() for r in caplog.records)
    assert not (out / ".lock").exists()


def test_full_disk_during_save_is_one_line_and_keeps_the_last_checkpoint(tiny_dir, tmp_path, capsys,
                                                                         monkeypatch):
    import orbax.checkpoint as ocp

    real_save, calls = ocp.CheckpointManager.save, []

    def save(self, step, *args, **kwargs):
        calls.append(step)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    out = tmp_path / "out"
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, "train.epochs=3", *FAST))
    assert code == 2 and len(err) == 1, err
    assert "No space left on device" in err[0] and "last good checkpoint: step 0" in err[0]
    assert not (out / ".lock").exists()
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    code, err = resume(capsys, tiny_dir, out)              # the kept checkpoint restores
    assert code == 0, err
