"""Broken checkpoints fail through the CLI with one clear line and a non-zero exit."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxcore.cli import main


def broken_copy(src, dst, edit_tensors=None, edit_config=None):
    shutil.copytree(src, dst)
    if edit_tensors:
        tensors = load_file(str(dst / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def run_cli(capsys, *args):
    capsys.readouterr()
    code = main(["convert", *map(str, args)])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


CASES = {
    "unknown_model_type": (dict(edit_config=lambda c: c.update(model_type="mamba")), "unsupported model_type 'mamba'"),
    "missing_tensor": (dict(edit_tensors=lambda t: t.pop("model.norm.weight")), "missing tensor model.norm.weight"),
    "unexpected_tensor": (dict(edit_tensors=lambda t: t.update(extra=np.zeros(3, np.float32))),
                          "unexpected tensor extra"),
    "misshapen_tensor": (dict(edit_tensors=lambda t: t.update(
        {"model.layers.0.mlp.up_proj.weight": np.zeros((5, 64), np.float32)})),
        "tensor model.layers.0.mlp.up_proj.weight: shape (5, 64), expected (128, 64)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_checkpoint_one_line_error(tiny_dir, tmp_path, capsys, case):
    edits, expected = CASES[case]
    bad = broken_copy(tiny_dir("llama"), tmp_path / "bad", **edits)
    code, err = run_cli(capsys, "--from-hf", bad, "--out", tmp_path / "ckpt")
    assert code == 2
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "ckpt").exists()   # nothing half-written


def test_pickle_only_checkpoint_is_refused(tiny_dir, tmp_path, capsys):
    bad = broken_copy(tiny_dir("llama"), tmp_path / "bad")
    (bad / "model.safetensors").rename(bad / "pytorch_model.bin")
    code, err = run_cli(capsys, "--from-hf", bad, "--out", tmp_path / "ckpt")
    assert code == 2 and len(err) == 1
    assert "pytorch_model.bin" in err[0] and "never unpickles" in err[0]


def test_corrupt_safetensors_is_named(tiny_dir, tmp_path, capsys):
    bad = broken_copy(tiny_dir("gpt2"), tmp_path / "bad")
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    code, err = run_cli(capsys, "--from-hf", bad, "--out", tmp_path / "ckpt")
    assert code == 2 and len(err) == 1
    assert "model.safetensors: not a valid safetensors file" in err[0]


def test_missing_config_and_bad_jaxcore_checkpoint(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, "--from-hf", tmp_path / "empty", "--out", tmp_path / "x")
    assert code == 2 and "config.json: missing" in err[0]
    code, err = run_cli(capsys, "--to-hf", tmp_path / "empty", "--out", tmp_path / "x")
    assert code == 2 and "not a jaxcore checkpoint" in err[0]


def test_both_directions_through_the_real_command(tiny_dir, tmp_path):
    """End to end as a user runs it: a subprocess, exit codes, and a loadable export."""
    src = tiny_dir("gpt2")
    cmd = [sys.executable, "-m", "jaxcore.cli", "convert"]
    done = subprocess.run([*cmd, "--from-hf", src, "--out", tmp_path / "ckpt"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*cmd, "--to-hf", tmp_path / "ckpt", "--out", tmp_path / "hf"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    bad = subprocess.run([*cmd, "--from-hf", tmp_path / "nope", "--out", tmp_path / "x"], capture_output=True,
                         text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"jaxcore convert: error: {tmp_path / 'nope'}: not a directory"]


def proc_reports_umask() -> bool:
    try:
        return "Umask:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("umask,dir_mode,file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
@pytest.mark.parametrize("proc", [
    pytest.param(True, marks=pytest.mark.skipif(not proc_reports_umask(), reason="no Umask in /proc/self/status")),
    False], ids=["proc", "no-proc"])
def test_exported_directories_get_umask_modes_not_mkdtemps(tmp_path, monkeypatch, umask, dir_mode, file_mode, proc):
    """The export gets a plain mkdir/open's modes under the umask, not mkdtemp's 0700 or a writer's 0600. The
    umask is read from /proc without touching the process-global one; only without /proc is it set and restored."""
    import os
    import stat
    import tempfile

    from jaxcore import outputs
    from jaxcore.hf import convert

    def write(tmp):
        fd, name = tempfile.mkstemp(dir=tmp)                    # 0600, like some writers
        os.close(fd)
        os.rename(name, tmp / "model.safetensors")
        (tmp / "sub").mkdir(mode=0o700)

    def forbidden(mask):
        raise AssertionError(f"os.umask({mask:o}) called although /proc reports the umask")

    old = os.umask(umask)
    try:
        with monkeypatch.context() as patch:
            if proc:
                patch.setattr(os, "umask", forbidden)
            else:
                patch.setattr(outputs, "PROC_STATUS", tmp_path / "no-proc" / "status")
            out = convert.atomic_directory(tmp_path / "export", write)
        assert os.umask(umask) == umask                         # the fallback restored it
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    assert stat.S_IMODE((out / "sub").stat().st_mode) == dir_mode
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == file_mode


def test_a_failed_write_keeps_the_old_directory_and_leaves_no_temporary(tmp_path):
    """A full disk half-way through replacing a directory: one-line OutputError, the old directory as it was."""
    import errno

    from jaxcore.errors import OutputError
    from jaxcore.hf import convert

    out = tmp_path / "export"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def write(tmp):
        (tmp / "new.txt").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match=r"export: writing failed \(No space left on device\)"):
        convert.atomic_directory(out, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert [p.name for p in out.iterdir()] == ["old.txt"] and (out / "old.txt").read_text() == "old"


def test_an_export_never_replaces_its_own_input(tiny_dir, tmp_path):
    """save_hf over the directory its tokenizer comes from (or one holding it) is refused, even with overwrite."""
    import shutil

    from jaxcore.errors import OutputError
    from jaxcore.hf import convert

    source = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_dir("llama"), source)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    model = convert.load_hf(source)
    for out in (source, source.parent):
        with pytest.raises(OutputError, match="is also an input|contains the input"):
            convert.save_hf(model, out, tokenizer_dir=source, overwrite=True)
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_a_single_file_beside_a_sharded_index_is_what_transformers_loads(tiny_dir, tmp_path):
    """transformers' from_pretrained reads model.safetensors where a directory has both it and a sharded index
    (before: jaxcore read the shards, another model's weights)."""
    import torch
    import transformers

    import jaxcore

    both = Path(shutil.copytree(tiny_dir("llama", max_shard_size="40KB"), tmp_path / "both"))
    assert (both / "model.safetensors.index.json").is_file()
    shutil.copy(tiny_dir("llama", seed=1) / "model.safetensors", both / "model.safetensors")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(both), dtype=torch.float32)
    ours = jaxcore.load_hf(both)
    np.testing.assert_array_equal(np.asarray(ours.embed.table), theirs.model.embed_tokens.weight.detach().numpy())
