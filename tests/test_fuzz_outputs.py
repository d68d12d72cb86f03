"""Outputs across the CLIs: no command deletes or changes what existed before it, whatever its output path.

Table-driven, like tests/test_fuzz_cli.py (whose helpers this uses): each row of CASES is (id, cli, argv template,
expected substring of the one stderr line, fault). Every case runs in a scratch folder `{tmp}` holding two tiny HF
models under `{tmp}/models`, a jaxcore checkpoint `{tmp}/ckpt`, a file `{tmp}/afile`, a link `{tmp}/link` and the
inputs in FILES; it must exit non-zero with exactly one stderr line, no traceback, and leave every file and folder
of `{tmp}` as it was (same paths, same bytes: no input deleted, no old output replaced, no temporary left over).

A fault simulates the filesystem failing half-way (a full disk, a read-only mount) by patching the lowest writer
a command goes through to raise the OSError (or the library error carrying it) a real one raises.

SPECIAL_CASES put a named pipe or a character device (made in the scratch folder, never /dev's) where each output
path of each command goes, every entry of train.out_dir a run writes included: refused in one line before any
work, the pipe or device left in place. SPECIAL_WRITERS do the same to the writers a run calls mid-run and the
Python API's (metrics, the reward plot, the completions logs, the lock, jaxcore.trl's save_model).
"""

import errno
import os
import shutil
import stat
import types
from pathlib import Path

import pytest
from cli_runs import es_args, grpo_args, run_cli
from test_fuzz_cli import assert_one_line, call_cli

FILES = {
    "afile": "an existing output\n",
    "prompts.jsonl": '{"prompt": "1 + 1 ="}\n',
    "plan.yaml": "es:\n  population: 8\n",
    "questions.json": '[["Convert 1 km to m.", 1000.0]]\n',
    "data/train.json": '[["Convert 2 km to m.", 2000.0]]\n',
    "run/final_hf/config.json": "{}\n",
    "quits.py": "import sys\nsys.exit(0)\n\n\ndef fn(completions, **kwargs):\n    return [1.0] * len(completions)\n",
    "logged/completions/completions_00001.parquet": "an earlier run's completions log\n",     # no checkpoint
    "compfile/completions": "a file where the completions directory goes\n",
}


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def erofs(*args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def safetensors_full(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


FAULTS = {                                # name -> (module, attribute path, replacement)
    "fsync-enospc": ("os", "fsync", enospc),
    "safetensors-enospc": ("jaxcore.hf.convert", "save_file", safetensors_full),
    "orbax-enospc": ("orbax.checkpoint", "PyTreeCheckpointer.save", enospc),
    "mkdtemp-erofs": ("tempfile", "mkdtemp", erofs),
    "mkstemp-erofs": ("tempfile", "mkstemp", erofs),
    "write-text-enospc": ("pathlib", "Path.write_text", enospc),
}

M = ["--max-new-tokens", "2"]


def es(out: str, *extra: str) -> list[str]:
    """`jaxcore es` on the scratch folder's tiny model."""
    return ["es", *es_args("{tmp}/models/tiny", out, *extra)]


CASES = [
    # an output that is, contains or lies inside an input: refused, even with --overwrite
    ("convert-out-contains-input", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/models"],
     "--out {tmp}/models contains the input {tmp}/models/tiny", None),
    ("convert-overwrite-never-deletes-input", "jaxcore",
     ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/models", "--overwrite"],
     "contains the input", None),
    ("convert-out-is-input", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/models/tiny",
                                         "--overwrite"],
     "--out {tmp}/models/tiny is also an input", None),
    ("convert-out-inside-input", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out",
                                             "{tmp}/models/tiny/sub"],
     "is inside the input {tmp}/models/tiny", None),
    ("convert-to-hf-out-is-input", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/ckpt",
                                               "--overwrite"],
     "--out {tmp}/ckpt is also an input", None),
    ("convert-gguf-out-is-input", "jaxcore", ["convert", "--from-gguf", "{tmp}/afile", "--out", "{tmp}/afile"],
     "is also an input", None),
    ("generate-output-is-prompts", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompts-file",
                                               "{tmp}/prompts.jsonl", "--output", "{tmp}/prompts.jsonl",
                                               "--overwrite", *M],
     "--output {tmp}/prompts.jsonl is also an input", None),
    ("generate-output-inside-model", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi",
                                                 "--output", "{tmp}/models/tiny/out.jsonl", "--overwrite", *M],
     "is inside the input {tmp}/models/tiny", None),
    ("plan-json-is-config", "jaxcore", ["plan", "--config", "{tmp}/plan.yaml", "--json", "{tmp}/plan.yaml",
                                        "--overwrite", "model.path={tmp}/models/tiny"],
     "--json {tmp}/plan.yaml is also an input", None),
    ("rft-datagen-out-is-questions", "torchref", ["rft-datagen", "--model", "{tmp}/models/tiny", "--questions",
                                                  "{tmp}/questions.json", "--out", "{tmp}/questions.json",
                                                  "--overwrite"],
     "--out {tmp}/questions.json is also an input", None),
    ("rft-eval-json-is-questions", "torchref", ["rft-eval", "--model", "{tmp}/models/tiny", "--questions",
                                                "{tmp}/questions.json", "--json", "{tmp}/questions.json",
                                                "--overwrite"],
     "--json {tmp}/questions.json is also an input", None),
    ("rft-train-out-is-model", "torchref", ["rft-train", "--model", "{tmp}/models/tiny", "--data",
                                            "{tmp}/questions.json", "--out", "{tmp}/models/tiny", "--resume"],
     "--out {tmp}/models/tiny is also an input", None),
    ("es-final-hf-is-model", "jaxcore", ["es", "model.path={tmp}/run/final_hf", "train.out_dir={tmp}/run"],
     "final_hf {tmp}/run/final_hf is also an input", None),
    # an output that exists and is not empty: refused without --overwrite
    ("convert-out-exists", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/models/other"],
     "--out {tmp}/models/other already exists and is not empty (pass --overwrite", None),
    ("generate-output-exists", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi", "--output",
                                           "{tmp}/afile", *M],
     "--output {tmp}/afile already exists and is not empty", None),
    ("plan-json-exists", "jaxcore", ["plan", "--json", "{tmp}/afile", "model.path={tmp}/models/tiny"],
     "--json {tmp}/afile already exists and is not empty", None),
    ("bench-json-exists", "jaxcore", ["bench", "--suite", "rft", "--quick", "--json", "{tmp}/afile",
                                      "--workdir", "{tmp}/benchwork"],
     "--json {tmp}/afile already exists and is not empty", None),
    ("bench-json-is-a-directory", "jaxcore", ["bench", "--suite", "rft", "--quick", "--json", "{tmp}/models",
                                              "--workdir", "{tmp}/benchwork"],
     "--json {tmp}/models is a directory; expected a file path", None),
    ("rft-data-out-exists", "torchref", ["rft-data", "--out", "{tmp}/data", "--train", "2", "--valid", "1"],
     "{tmp}/data/train.json already exists and is not empty", None),
    ("rft-train-out-exists", "torchref", ["rft-train", "--model", "{tmp}/models/tiny", "--data",
                                          "{tmp}/questions.json", "--out", "{tmp}/models/other"],
     "already exists and is not empty (pass --resume to continue the run in it, or --overwrite", None),
    ("es-fresh-run-over-final-hf", "jaxcore", es("{tmp}/run"),
     "final_hf {tmp}/run/final_hf already exists and is not empty (continue that run with --resume", None),
    # the wrong kind of path
    ("convert-out-is-file", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/afile", "--overwrite"],
     "--out {tmp}/afile exists and is not a directory", None),
    ("convert-out-under-file", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/afile/sub"],
     "{tmp}/afile is a file, not a directory", None),
    ("convert-out-is-link", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/link", "--overwrite"],
     "--out {tmp}/link is a symbolic link", None),
    ("generate-output-is-dir", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi",
                                           "--output", "{tmp}/data", "--overwrite", *M],
     "--output {tmp}/data is a directory; expected a file path", None),
    ("generate-output-is-link", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi",
                                            "--output", "{tmp}/link", "--overwrite", *M],
     "--output {tmp}/link is a symbolic link", None),
    ("es-out-dir-is-file", "jaxcore", es("{tmp}/afile"),
     "train.out_dir {tmp}/afile exists and is not a directory", None),
    ("es-out-dir-under-file", "jaxcore", es("{tmp}/afile/run"),
     "{tmp}/afile is a file, not a directory", None),
    ("es-out-dir-dangling-link", "jaxcore", es("{tmp}/dangling"),
     "train.out_dir {tmp}/dangling is a symbolic link to nothing", None),
    # completions logs: a fresh run over an earlier run's (before: replaced without a word), a file where their
    # directory goes (before: "unexpected FileExistsError" at the first logged step)
    ("es-fresh-run-over-completions", "jaxcore", es("{tmp}/logged", "train.log_completions=true"),
     "train.out_dir {tmp}/logged already holds completions/completions_00001.parquet, which a fresh run would "
     "replace: pass --resume", None),
    ("grpo-completions-is-a-file", "jaxcore", ["grpo", *grpo_args("{tmp}/models/tiny", "{tmp}/compfile",
                                                                  "train.log_completions=true")],
     "train.out_dir's completions {tmp}/compfile/completions is not a directory; a run writes its completions logs "
     "in it", None),
    # settings that would lose work, user code that would end the run
    ("es-infinite-learning-rate", "jaxcore", es("{tmp}/new", "optimizer.learning_rate=inf"),
     "optimizer.learning_rate", None),
    ("es-keep-no-checkpoint", "jaxcore", es("{tmp}/new", "train.max_to_keep=0"),
     "max_to_keep", None),
    ("es-reward-module-exits", "jaxcore", es("{tmp}/new", "rewards.functions=[{tmp}/quits.py:fn]"),
     "importing it called sys.exit(0)", None),
    # the filesystem failing half-way: one line, the old output (if any) intact, no temporary left
    ("convert-to-hf-full-disk-keeps-old", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out",
                                                      "{tmp}/models/other", "--overwrite"],
     "{tmp}/models/other: writing failed (No space left on device)", "safetensors-enospc"),
    ("convert-from-hf-full-disk", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/new"],
     "{tmp}/new: writing failed (No space left on device)", "orbax-enospc"),
    ("convert-read-only", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/new"],
     "{tmp}/new: writing failed (Read-only file system)", "mkdtemp-erofs"),
    ("generate-full-disk-keeps-old", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi",
                                                 "--output", "{tmp}/afile", "--overwrite", *M],
     "{tmp}/afile: writing failed (No space left on device)", "fsync-enospc"),
    ("generate-read-only", "jaxcore", ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi",
                                       "--output", "{tmp}/new.jsonl", *M],
     "{tmp}/new.jsonl: writing failed (Read-only file system)", "mkstemp-erofs"),
    ("plan-json-full-disk", "jaxcore", ["plan", "--json", "{tmp}/afile", "--overwrite",
                                        "model.path={tmp}/models/tiny"],
     "{tmp}/afile: writing failed (No space left on device)", "fsync-enospc"),
    ("rft-data-full-disk", "torchref", ["rft-data", "--out", "{tmp}/data", "--train", "2", "--valid", "1",
                                        "--overwrite"],
     "{tmp}/data/train.json: writing failed (No space left on device)", "write-text-enospc"),
]


def listing(folder: Path) -> dict[str, str]:
    """Every path under `folder` (links not followed; hidden ones too) with its content hash, "dir", "link", or
    what special file it is (never read: a pipe's read would wait for a writer)."""
    import hashlib

    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        mode = path.lstat().st_mode
        if stat.S_ISFIFO(mode):
            out[key] = "named pipe"
        elif stat.S_ISCHR(mode):
            out[key] = f"character device {os.major(path.lstat().st_rdev)},{os.minor(path.lstat().st_rdev)}"
        elif path.is_symlink():
            out[key] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            out[key] = "dir"
        else:
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def scratch_template(tiny_dir, tmp_path_factory) -> Path:
    """The scratch folder every case starts from (copied per case)."""
    from jaxcore.cli import main

    root = tmp_path_factory.mktemp("outputs-template")
    model = tiny_dir("llama")
    shutil.copytree(model, root / "models" / "tiny")
    shutil.copytree(model, root / "models" / "other")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert main(["convert", "--from-hf", str(model), "--out", str(root / "ckpt")]) == 0
    shutil.copytree(model, root / "run" / "final_hf", dirs_exist_ok=True)      # an earlier run's export
    (root / "link").symlink_to(root / "models" / "other")
    (root / "dangling").symlink_to(root / "nowhere")
    return root


def fill(arg: str, tmp: Path) -> str:
    return arg.replace("{tmp}", str(tmp))


def scratch(template: Path, tmp_path: Path) -> Path:
    """A copy of the scratch template for one case."""
    tmp = tmp_path / "scratch"
    shutil.copytree(template, tmp, symlinks=True)
    for link in ("link", "dangling"):           # the copied links still point into the template: re-point them
        target = os.readlink(tmp / link).replace(str(template), str(tmp))
        (tmp / link).unlink()
        (tmp / link).symlink_to(target)
    return tmp


@pytest.mark.parametrize("cli,argv,expected,fault", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_failed_command_changes_nothing(scratch_template, tmp_path, capsys, monkeypatch, cli, argv, expected,
                                          fault):
    import importlib

    tmp = scratch(scratch_template, tmp_path)
    before = listing(tmp)
    if fault is not None:
        module, attribute, replacement = FAULTS[fault]
        *owners, name = attribute.split(".")
        target = importlib.import_module(module)
        for owner in owners:
            target = getattr(target, owner)
        monkeypatch.setattr(target, name, replacement)
    code, out = call_cli(capsys, cli, [fill(a, tmp) for a in argv])
    monkeypatch.undo()
    assert_one_line(code, out.out, out.err, fill(expected, tmp))
    assert listing(tmp) == before


def test_full_disk_at_the_final_export_keeps_the_checkpoints(tiny_dir, tmp_path, capsys, monkeypatch):
    """The run trains and checkpoints, then the disk fills while final_hf is written: one line naming final_hf,
    the last checkpoint intact (the run resumes from it), no final_hf and no temporary directory left."""
    from jaxcore.hf import convert

    monkeypatch.setattr(convert, "write_safetensors", enospc)
    out = tmp_path / "run"
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, "train.epochs=1", "train.eval_every=-1"))
    assert code == 2 and len(err) == 1, err
    assert f"{out}/final_hf: writing failed (No space left on device)" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "metrics.jsonl", "reward.png"]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["0"]


# ----------------------------------------------------------------------------- special files where outputs go

KINDS = {"fifo": "a named pipe", "chardev": "a character device"}


def make_special(path: Path, kind: str) -> None:
    """A named pipe, or a character device with the null device's numbers (made here: /dev is never touched)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        return
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a character device needs root")


G = ["generate", "--model", "{tmp}/models/tiny", "--prompt", "hi", *M]
LOG = "completions/completions_00001.parquet"
# Every entry of train.out_dir a run writes, with the settings under which it writes it.
OUT_DIR_ENTRIES = [(".lock", ()), ("metrics.jsonl", ()), ("reward.png", ()), ("checkpoints", ()),
                   ("tensorboard", ("train.tensorboard=true",)), ("completions", ("train.log_completions=true",)),
                   (LOG, ("train.log_completions=true",))]

SPECIAL_CASES = [   # (id, cli, argv template, where the special file goes under {tmp}, the name the line gives it)
    ("generate-output", "jaxcore", [*G, "--output", "{tmp}/special"], "special", "--output"),
    ("generate-output-overwrite", "jaxcore", [*G, "--output", "{tmp}/special", "--overwrite"], "special",
     "--output"),
    ("plan-json", "jaxcore", ["plan", "--json", "{tmp}/special", "model.path={tmp}/models/tiny"], "special", "--json"),
    ("plan-json-overwrite", "jaxcore", ["plan", "--json", "{tmp}/special", "--overwrite",
                                        "model.path={tmp}/models/tiny"], "special", "--json"),
    ("bench-json", "jaxcore", ["bench", "--suite", "rft", "--quick", "--json", "{tmp}/special", "--overwrite",
                               "--workdir", "{tmp}/benchwork"], "special", "--json"),
    ("convert-out", "jaxcore", ["convert", "--to-hf", "{tmp}/ckpt", "--out", "{tmp}/special", "--overwrite"],
     "special", "--out"),
    ("convert-from-hf-out", "jaxcore", ["convert", "--from-hf", "{tmp}/models/tiny", "--out", "{tmp}/special"],
     "special", "--out"),
    ("rft-datagen-out", "torchref", ["rft-datagen", "--model", "{tmp}/models/tiny", "--questions",
                                     "{tmp}/questions.json", "--out", "{tmp}/special", "--overwrite"],
     "special", "--out"),
    ("rft-eval-json", "torchref", ["rft-eval", "--model", "{tmp}/models/tiny", "--questions", "{tmp}/questions.json",
                                   "--json", "{tmp}/special", "--overwrite"], "special", "--json"),
    ("rft-data-out-file", "torchref", ["rft-data", "--out", "{tmp}/split", "--train", "2", "--valid", "1",
                                       "--overwrite"], "split/train.json", "--out file"),
    ("rft-train-out", "torchref", ["rft-train", "--model", "{tmp}/models/tiny", "--data", "{tmp}/questions.json",
                                   "--out", "{tmp}/special", "--overwrite"], "special", "--out"),
    # every entry of train.out_dir a run writes: refused before training (before: metrics.jsonl a pipe hung the run,
    # reward.png a pipe failed after training on every resume, so final_hf was never written)
    *[(f"es-{entry}", "jaxcore", es("{tmp}/out", *extra), f"out/{entry}", f"train.out_dir's {entry}")
      for entry, extra in OUT_DIR_ENTRIES],
    ("es-resume-reward-png", "jaxcore", ["es", "--resume", *es_args("{tmp}/models/tiny", "{tmp}/out")],
     "out/reward.png", "train.out_dir's reward.png"),
    ("grpo-metrics", "jaxcore", ["grpo", *grpo_args("{tmp}/models/tiny", "{tmp}/out")], "out/metrics.jsonl",
     "train.out_dir's metrics.jsonl"),
    ("es-final-hf", "jaxcore", es("{tmp}/out"), "out/final_hf", "final_hf"),
    ("grpo-final-adapter", "jaxcore", ["grpo", *grpo_args("{tmp}/models/tiny", "{tmp}/out", "grpo.lora.rank=2")],
     "out/final_adapter", "final_adapter"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cli,argv,where,name", [c[1:] for c in SPECIAL_CASES], ids=[c[0] for c in SPECIAL_CASES])
def test_a_special_file_where_an_output_goes_is_refused_and_left_alone(scratch_template, tmp_path, capsys, cli,
                                                                       argv, where, name, kind):
    """One line naming the path and what it is, exit 2, the pipe or device still there and nothing else changed.
    (Before: generate --output and plan --json replaced it with a regular file and exited 0.)"""
    tmp = scratch(scratch_template, tmp_path)
    make_special(tmp / where, kind)
    before = listing(tmp)
    code, out = call_cli(capsys, cli, [fill(a, tmp) for a in argv])
    assert_one_line(code, out.out, out.err, f"{name} {tmp / where} is {KINDS[kind]}, not a regular file")
    assert listing(tmp) == before


def write_log(out: Path) -> None:
    from jaxcore.runtime.completions import CompletionLog, write_completions

    write_completions(out, 1, CompletionLog(["p"], ["c"], {"r": [1.0]}, [0.0]))


def write_metrics(out: Path) -> None:
    from jaxcore.runtime.metrics import MetricsLogger

    MetricsLogger(out, tensorboard=False).close()


def plot(out: Path) -> None:
    from jaxcore.runtime.metrics import plot_rewards

    log = out.parent / "log.jsonl"                  # beside out: the listing compared is out's
    log.write_text('{"step": 1, "reward": 0.5}\n')
    plot_rewards(log, out / "reward.png")


def take_lock(out: Path) -> None:
    from jaxcore.runtime.run_guard import OutDirLock

    with OutDirLock(out):
        pass


def trl_save_model(output_dir: Path):
    """jaxcore.trl's save_model of a finished run (its final_hf: the scratch's copy of the tiny model) to `output_dir`,
    on a trainer whose model and tokenizer came from {out}/base."""
    from jaxcore.trl.trainer import Trainer

    def save(out: Path) -> None:
        trainer = types.SimpleNamespace(args=types.SimpleNamespace(output_dir=str(out / "run")), lora=None,
                                        model_path=str(out / "base"), tokenizer_dir=str(out / "base"))
        Trainer.save_model(trainer, fill(str(output_dir), out))
    return save


SPECIAL_WRITERS = [  # (id, what a run or the API writes into {out}, where the special file goes, the line's name)
    ("metrics", write_metrics, "metrics.jsonl", "train.out_dir's metrics.jsonl"),
    ("reward-plot", plot, "reward.png", "train.out_dir's reward.png"),
    ("completions-log", write_log, LOG, "train.out_dir's completions log"),
    ("trl-save-model-file", trl_save_model(Path("{tmp}/saved")), "saved/config.json", "save_model's config.json"),
    ("trl-save-model-dir", trl_save_model(Path("{tmp}/saved")), "saved", "save_model's output_dir"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("write,where,name", [c[1:] for c in SPECIAL_WRITERS], ids=[c[0] for c in SPECIAL_WRITERS])
def test_a_writer_refuses_a_special_file_made_after_the_checks(tiny_dir, tmp_path, write, where, name, kind):
    """The writers a run calls mid-run (and the API's) refuse a pipe or device that appeared after the start's
    checks, in one line, and leave it there. (Before: metrics.jsonl a pipe hung, reward.png a pipe was
    "UnsupportedOperation", a completions log replaced it, save_model wrote through a device.)"""
    from jaxcore.errors import OutputError

    out = tmp_path / "out"
    shutil.copytree(tiny_dir("llama"), out / "run" / "final_hf")
    shutil.copytree(tiny_dir("llama"), out / "base")
    make_special(out / where, kind)
    before = listing(out)
    with pytest.raises(OutputError) as err:
        write(out)
    assert str(err.value).startswith(f"{name} {out / where} is {KINDS[kind]}, not a regular file"), str(err.value)
    assert "\n" not in str(err.value) and listing(out) == before


@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_that_is_a_special_file_is_one_line_not_a_hang(tmp_path, kind):
    """(Before: a named pipe at out_dir/.lock hung the run, reading the lock's owner from it.)"""
    from jaxcore.runtime.run_guard import OutDirLockedError

    make_special(tmp_path / ".lock", kind)
    with pytest.raises(OutDirLockedError, match=f"locked by {tmp_path / '.lock'}, which is {KINDS[kind]}, not a "
                                                "lock file; remove it if no run is using this out_dir"):
        take_lock(tmp_path)
    assert listing(tmp_path) == {".lock": "named pipe" if kind == "fifo" else "character device 1,3"}


@pytest.mark.parametrize("where", ["base", "base/sub"])
def test_trl_save_model_never_writes_into_the_model_it_started_from(tiny_dir, tmp_path, where):
    """save_model(<the directory the model was loaded from>) wrote the trained weights over the base model's; the
    output inside an input is refused as everywhere else, before anything is written."""
    from jaxcore.errors import OutputError

    out = tmp_path / "out"
    shutil.copytree(tiny_dir("llama"), out / "run" / "final_hf")
    shutil.copytree(tiny_dir("llama"), out / "base")
    (out / "run" / "final_hf" / "model.safetensors").write_bytes(b"trained weights")
    before = listing(out)
    with pytest.raises(OutputError) as err:
        trl_save_model(Path("{tmp}") / where)(out)
    relation = "is also an input" if where == "base" else f"is inside the input {out / 'base'}"
    assert str(err.value) == f"save_model's output_dir {out / where} {relation}; write the output somewhere else"
    assert listing(out) == before
    trl_save_model(Path("{tmp}/saved"))(out)                                   # elsewhere: the run's files
    assert (out / "saved" / "model.safetensors").read_bytes() == b"trained weights"
    assert sorted(p.name for p in (out / "saved").iterdir()) == sorted(p.name for p in (out / "base").iterdir())
