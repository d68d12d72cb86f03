"""A stop signal during the final HF export: the export cannot stop half-way, so it is abandoned whole. One line
says what was kept, the exit code is the signal's, the temporary copy is removed and the lock released, and
`--resume` exports (removing a copy a killed process left)."""

import os
import signal

import pytest

from jaxcore.hf import convert
from tests.cli_runs import es_args, run_cli


def test_sigterm_during_the_final_export_leaves_no_copy_and_resume_exports(tiny_dir, tmp_path, capsys, monkeypatch):
    """Before: SIGTERM's default ended the process mid-write, without a message, with the lock and a full
    `.final_hf.tmp-*` copy left, which `--resume` never removed."""
    out = tmp_path / "out"
    write_directory = convert.write_directory

    def write_then_sigterm(out_dir, write, **kwargs):
        def written_then_signalled(tmp):
            write(tmp)                                         # the whole copy is there; the signal comes next
            os.kill(os.getpid(), signal.SIGTERM)

        return write_directory(out_dir, written_then_signalled, **kwargs)

    monkeypatch.setattr(convert, "write_directory", write_then_sigterm)
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, "train.epochs=1", "train.eval_every=-1"))
    assert code == 128 + signal.SIGTERM and len(err) == 1, err
    assert err[0].startswith(f"stopped by SIGTERM during the export to {out / 'final_hf'}: nothing was written"), err
    assert "run again with --resume to export" in err[0]
    assert not (out / "final_hf").exists() and not list(out.glob(".final_hf.tmp-*")) and not (out / ".lock").exists()
    monkeypatch.setattr(convert, "write_directory", write_directory)
    (out / ".final_hf.tmp-left-by-kill-9").mkdir()                     # what a killed process leaves
    (out / ".final_hf.tmp-left-by-kill-9" / "model.safetensors").write_bytes(b"partial")
    code, err = run_cli(capsys, "es", "--resume", *es_args(tiny_dir("llama"), out, "train.epochs=1",
                                                           "train.eval_every=-1"))
    assert code == 0, err
    assert (out / "final_hf" / "config.json").is_file() and not list(out.glob(".final_hf.tmp-*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_interrupts_export_raises_the_signal_as_interrupted(signum):
    from jaxcore.errors import Interrupted
    from jaxcore.runtime.signals import interrupts_export

    before = signal.getsignal(signum)
    with pytest.raises(Interrupted) as raised, interrupts_export("the test"):
        os.kill(os.getpid(), signum)
    assert raised.value.exit_code == 128 + signum and str(raised.value).startswith(
        f"stopped by {signal.Signals(signum).name} during the test")
    assert signal.getsignal(signum) is before
