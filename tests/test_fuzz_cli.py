"""Malformed inputs across the CLIs: each exits non-zero with one stderr line naming the problem, no traceback,
inputs and existing checkpoints unchanged.

Table-driven: add a row to CASES as (id, cli, argv template, expected substring of the stderr line). `{model}`
is a tiny HF directory, `{tmp}` a scratch directory holding FILES. CHECKPOINT_CASES run against an out_dir
that already holds two checkpoints of a tiny ES run. SUBPROCESS_CASES run the real `jaxcore`/`torchref`
executables (in parallel, started by the first test), so stray logging or tracebacks on the process's real
stderr are caught too; one of them is interrupted with SIGINT.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

FILES = {
    "bad.yaml": "es: [unclosed\n",
    "list.yaml": "- 1\n- 2\n",
    "types.yaml": "es:\n  population: many\n",
    "prompts.jsonl": '{"prompt": 1}\n',
    "broken.jsonl": "{not json\n",
    "empty.txt": "",
    "notdir": "x",
    "questions.json": '[["What is 12 plus 30 and why?", "42"]]',
}

CASES = [
    ("es-no-config-file", "jaxcore", ["es", "--config", "{tmp}/missing.yaml"],
     "{tmp}/missing.yaml: no such config file"),
    ("es-bad-yaml", "jaxcore", ["es", "--config", "{tmp}/bad.yaml"],
     "bad.yaml: line 2 invalid YAML"),
    ("es-yaml-not-mapping", "jaxcore", ["es", "--config", "{tmp}/list.yaml"],
     "the top level must be a mapping"),
    ("es-wrong-type", "jaxcore", ["es", "--config", "{tmp}/types.yaml"],
     "es.population: expected an integer, got 'many'"),
    ("es-unknown-key", "jaxcore", ["es", "model.path={model}", "es.nope=1", "train.out_dir={tmp}/o"],
     "unknown config key es.nope"),
    ("es-bad-number", "jaxcore", ["es", "model.path={model}", "es.sigma=abc", "train.out_dir={tmp}/o"],
     "es.sigma: expected a number, got 'abc'"),
    ("es-odd-population", "jaxcore", ["es", "model.path={model}", "es.population=7", "train.out_dir={tmp}/o"],
     "population must be an even number"),
    ("es-no-model", "jaxcore", ["es", "train.out_dir={tmp}/o"],
     "model.path is not set"),
    ("es-model-not-dir", "jaxcore", ["es", "model.path={tmp}/notdir", "train.out_dir={tmp}/o"],
     "notdir: neither an HF model directory"),
    ("es-bad-task", "jaxcore", ["es", "model.path={model}", "task.name=nope", "train.out_dir={tmp}/o"],
     "unknown task 'nope'"),
    ("es-resume-nothing", "jaxcore", ["es", "--resume", "model.path={model}", "train.out_dir={tmp}/o",
                                      "train.progress=false"],
     "no checkpoint to resume from"),
    ("plan-no-config-json", "jaxcore", ["plan", "model.path={tmp}/missing"],
     "no config.json"),
    ("plan-bad-memory", "jaxcore", ["plan", "model.path={model}", "--device-memory", "lots"],
     "device memory 'lots'"),
    ("plan-bad-mesh", "jaxcore", ["plan", "model.path={model}", "mesh.model=3"],
     "mesh.model=3 does not divide 8 devices"),
    ("plan-bad-yaml", "jaxcore", ["plan", "--config", "{tmp}/bad.yaml"],
     "invalid YAML"),
    ("grpo-bad-yaml", "jaxcore", ["grpo", "--config", "{tmp}/bad.yaml"],
     "invalid YAML"),
    ("grpo-unknown-key", "jaxcore", ["grpo", "grpo.nope=1"],
     "unknown config key grpo.nope"),
    ("grpo-bad-bool", "jaxcore", ["grpo", "grpo.mask_truncated_completions=maybe"],
     "grpo.mask_truncated_completions: expected true/false, got 'maybe'"),
    ("generate-missing-model", "jaxcore", ["generate", "--model", "{tmp}/missing", "--prompt", "hi"],
     "{tmp}/missing: neither an HF model directory"),
    ("generate-no-prompt", "jaxcore", ["generate", "--model", "{model}"],
     "give --prompt or --prompts-file"),
    ("generate-bad-prompts-json", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                              "{tmp}/broken.jsonl"],
     "broken.jsonl:1: invalid JSON"),
    ("generate-prompt-not-string", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                               "{tmp}/prompts.jsonl"],
     "prompts.jsonl:1: missing string field 'prompt'"),
    ("generate-empty-prompts", "jaxcore", ["generate", "--model", "{model}", "--prompts-file", "{tmp}/empty.txt"],
     "empty.txt: no prompts"),
    ("generate-too-many-tokens", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi",
                                             "--max-new-tokens", "100000"],
     "max_new_tokens 100000 leaves no room"),
    ("generate-long-prompt-no-truncate", "jaxcore", ["generate", "--model", "{model}", "--prompt",
                                                     " ".join(["7"] * 1200), "--no-truncate-prompts"],
     "longer than the 448 positions left for a prompt"),
    ("convert-missing", "jaxcore", ["convert", "--from-hf", "{tmp}/missing", "--out", "{tmp}/c"],
     "{tmp}/missing: not a directory"),
    ("convert-not-dir", "jaxcore", ["convert", "--from-hf", "{tmp}/notdir", "--out", "{tmp}/c"],
     "{tmp}/notdir: not a directory"),
    ("es-bad-flag", "jaxcore", ["es", "--no-such-flag"],
     "unrecognized arguments: --no-such-flag"),
    ("unknown-command", "jaxcore", ["nope"],
     "invalid choice: 'nope'"),
    ("datagen-missing-questions", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                               "{tmp}/missing.json", "--out", "{tmp}/r.json"],
     "missing.json: no such file"),
    ("datagen-bad-questions", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                           "{tmp}/broken.jsonl", "--out", "{tmp}/r.json"],
     "broken.jsonl:1: invalid JSON"),
    ("datagen-bad-temperature", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                             "{tmp}/broken.jsonl", "--out", "{tmp}/r.json", "--temperature", "x"],
     "argument --temperature: invalid float value: 'x'"),
    ("datagen-prompt-too-long", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                             "{tmp}/questions.json", "--out", "{tmp}/r.json", "--max-prompt-length",
                                             "4", "--no-truncate-prompts", "--no-progress"],
     "longer than max_prompt_length 4"),
    ("train-missing-data", "torchref", ["rft-train", "--model", "{model}", "--data", "{tmp}/missing.json",
                                        "--out", "{tmp}/t"],
     "missing.json: no such file"),
    ("eval-missing-model", "torchref", ["rft-eval", "--model", "{tmp}/missing", "--questions",
                                        "{tmp}/questions.json"],
     "{tmp}/missing: no such model directory"),
    ("eval-bad-questions", "torchref", ["rft-eval", "--model", "{model}", "--questions", "{tmp}/broken.jsonl"],
     "broken.jsonl:1: invalid JSON"),
    ("data-bad-count", "torchref", ["rft-data", "--out", "{tmp}/d", "--train", "many"],
     "argument --train: invalid int value: 'many'"),
]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_files(folder: Path) -> None:
    for name, text in FILES.items():
        (folder / name).write_text(text)


def call_cli(capsys, cli: str, args: list[str]):
    import jaxcore.cli
    import torchref.cli

    capsys.readouterr()
    try:
        code = (jaxcore.cli if cli == "jaxcore" else torchref.cli).main(args)
    except SystemExit as exit_:            # argparse errors
        code = exit_.code
    return code, capsys.readouterr()


def assert_one_line(code, out: str, err: str, expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code not in (0, None), (code, out, err)
    assert len(lines) == 1, err
    assert expected in lines[0], (expected, lines[0])
    assert "Traceback" not in err + out


@pytest.mark.parametrize("cli,argv,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_is_one_line(tiny_dir, tmp_path, capsys, subprocess_runs, cli, argv, expected):
    # (subprocess_runs: requested here only so the real processes start first and run alongside these cases)
    model = tiny_dir("llama")
    write_files(tmp_path)
    before = digest(tmp_path), digest(Path(model))
    args = [a.format(model=model, tmp=tmp_path) for a in argv]
    code, out = call_cli(capsys, cli, args)
    assert_one_line(code, out.out, out.err, expected.format(model=model, tmp=tmp_path))
    after = digest(tmp_path), digest(Path(model))
    assert {k: v for k, v in after[0].items() if k in before[0]} == before[0] and after[1] == before[1]


# --------------------------------------------------------------------------- an out_dir with checkpoints

ES_RUN = ["task.name=addition", "rollout.prompts_per_epoch=2", "rollout.max_new_tokens=3", "es.population=16",
          "train.epochs=2", "train.checkpoint_every=1", "train.eval_every=-1", "train.eval_prompts=4",
          "train.export_hf=false", "train.progress=false", "train.tensorboard=false"]


def es_overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.path={model}", f"train.out_dir={out}", *ES_RUN, *extra]


@pytest.fixture(scope="module")
def write_checkpoints(tiny_dir):
    """write_checkpoints(out) -> out/checkpoints/{0,1} as a 2-epoch `jaxcore es` run with ES_RUN would write them
    (the real algorithm's state and the runner's metadata; no training step is needed to write them)."""
    import jaxcore
    from jaxcore.config.yaml_config import load_config
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.es.config import ESConfig
    from jaxcore.hf.tokenization import eos_token_ids, load_tokenizer
    from jaxcore.runtime.runner import Runner, make_task

    model_dir = tiny_dir("llama")
    model, tokenizer = jaxcore.load_hf(model_dir), load_tokenizer(model_dir)
    cfg = load_config(ESConfig, None, es_overrides(model_dir, Path("unused")))
    algorithm = EggrollAlgorithm(model, tokenizer, cfg, eos_token_ids=eos_token_ids(tokenizer, model.config.hf_config))
    task = make_task(cfg.task, cfg.rewards.functions, cfg.rewards.weights)

    def write(out: Path) -> Path:
        runner = Runner(load_config(ESConfig, None, es_overrides(model_dir, out)), algorithm, tokenizer, task)
        for epoch in (0, 1):
            runner._save(epoch, wait=True)
        runner.checkpointer.close()
        return out

    return write


def truncate_meta(step_dir: Path) -> None:
    meta = step_dir / "meta" / "metadata"
    meta.write_text(meta.read_text()[:20])


def truncate_arrays(step_dir: Path) -> None:
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def nothing_restores(out: Path) -> None:
    truncate_meta(out / "checkpoints" / "1")
    truncate_arrays(out / "checkpoints" / "0")


def live_lock(out: Path) -> None:
    (out / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))


# (id, cli, argv template, damage(out) or None, expected, whether the design moves the checkpoints aside)
CHECKPOINT_CASES = [
    ("es-resume-nothing-restores", "jaxcore", ["es", "--resume"], nothing_restores,
     "none of the checkpoints [1, 0] restores", True),
    ("es-resume-population-changed", "jaxcore", ["es", "--resume", "es.population=8"], None,
     "different es.population: 16 -> 8", False),
    ("es-resume-other-model-allowed", "jaxcore", ["es", "--resume", "--resume-allow-changes", "model.path={narrow}"],
     None, "different model parameter ['params']['", False),
    ("grpo-resume-es-checkpoint", "jaxcore", ["grpo", "--resume"], None, "algorithm: 'es' -> 'grpo'", False),
    ("es-locked-out-dir", "jaxcore", ["es", "--resume"], live_lock, f"in use by another run (pid {os.getpid()}", False),
    ("es-empty-lock", "jaxcore", ["es", "--resume"], lambda out: (out / ".lock").write_text(""),
     "does not name its owner", False),
    ("es-checkpoints-without-resume", "jaxcore", ["es"], None, "already holds checkpoints: pass --resume", False),
]


def moved_aside(out: Path) -> dict[str, str]:
    """Digests of the set-aside steps, keyed as they were in checkpoints/ ("1.corrupt-<time>/x" -> "1/x")."""
    moved = {}
    for path, sha in digest(out / "checkpoints-corrupt").items():
        step_dir, _, rest = path.partition("/")
        moved[f"{step_dir.split('.corrupt-')[0]}/{rest}"] = sha
    return moved


@pytest.mark.parametrize("cli,argv,damage,expected,aside", [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_malformed_resume_is_one_line_and_keeps_the_checkpoints(tiny_dir, tmp_path, capsys, write_checkpoints,
                                                                 subprocess_runs, cli, argv, damage, expected, aside):
    out = write_checkpoints(tmp_path / "out")
    if damage:
        damage(out)
    narrow = tiny_dir("llama", hidden=32)
    before = digest(out / "checkpoints"), digest(out)
    flags = [a for a in argv if "=" not in a]
    overrides = [a.format(narrow=narrow) for a in argv if "=" in a]          # after the base ones: they win
    base = [a for a in es_overrides(tiny_dir("llama"), out) if argv[0] == "es" or not a.startswith("es.")]
    args = [*flags, *base, *overrides]
    code, captured = call_cli(capsys, cli, args)
    assert_one_line(code, captured.out, captured.err, expected)
    if aside:   # the design: every step that fails to restore is renamed into checkpoints-corrupt/, bytes intact
        assert not [p for p in (out / "checkpoints").iterdir() if p.name.isdigit()]
        assert moved_aside(out) == before[0]
    else:       # refused before anything is read or written: the whole out_dir is as it was
        assert digest(out) == before[1] and not (out / "checkpoints-corrupt").exists()


# --------------------------------------------------------------------------- real processes

def executable(cli: str) -> list[str]:
    """The installed console script next to this Python, else `python -m <cli>.cli`."""
    script = Path(sys.executable).parent / cli
    return [str(script)] if script.is_file() else [sys.executable, "-m", f"{cli}.cli"]


# Runs the real CLI; the first call of `load_any` (inside the command, past argument parsing) leaves a marker
# file, so the test knows when an interrupt lands in the running command.
INTERRUPTIBLE = """
import sys
from pathlib import Path
import jaxcore.hf.model_checkpoint as mc
from jaxcore.cli import main
real = mc.load_any
def load_any(*args, **kwargs):
    Path(sys.argv[1]).write_text("loading")
    return real(*args, **kwargs)
mc.load_any = load_any
sys.exit(main(sys.argv[2:]))
"""

# (id, cli, argv template, damage(out) or None, expected substring, checkpoints moved aside)
SUBPROCESS_CASES = [
    ("es-resume-nothing-restores", "jaxcore", ["es", "--resume", *es_overrides("{model}", "{out}")],
     nothing_restores, "none of the checkpoints [1, 0] restores", True),
    ("es-bad-yaml", "jaxcore", ["es", "--config", "{tmp}/bad.yaml"], None, "invalid YAML", False),
    ("generate-interrupted", "interrupt", ["generate", "--model", "{model}", "--prompt", "hi", "--max-new-tokens",
                                          "400", "--temperature", "0"], None, "interrupted", False),
]


def interrupt_when_marked(process: subprocess.Popen, marker: Path) -> None:
    """SIGINT `process` as soon as it has entered the command (the marker exists)."""
    deadline = time.monotonic() + 240
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)


@pytest.fixture(scope="module")
def subprocess_runs(tiny_dir, write_checkpoints, tmp_path_factory):
    """Start every SUBPROCESS_CASE at once (they run while the in-process cases do); yields a function that
    waits for one and returns (code, stdout, stderr, folder, digests before)."""
    model = tiny_dir("llama")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}     # one CPU device, as a user has it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")]))
    started = {}
    for case_id, cli, argv, damage, _, _ in SUBPROCESS_CASES:
        folder = tmp_path_factory.mktemp(case_id)
        write_files(folder)
        out = folder / "out"
        if "{out}" in " ".join(argv):
            write_checkpoints(out)
            if damage:
                damage(out)
        before = digest(folder), digest(model)
        args = [a.format(model=model, tmp=folder, out=out) for a in argv]
        marker = folder / "marker"
        command = ([sys.executable, "-c", INTERRUPTIBLE, str(marker), *args] if cli == "interrupt"
                   else [*executable(cli), *args])
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=folder)
        if cli == "interrupt":
            threading.Thread(target=interrupt_when_marked, args=(process, marker), daemon=True).start()
        started[case_id] = (process, folder, before)

    def result(case_id: str):
        process, folder, before = started[case_id]
        stdout, stderr = process.communicate(timeout=300)
        return process.returncode, stdout, stderr, folder, before

    yield result
    for process, *_ in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("damage,expected,aside", [c[3:] for c in SUBPROCESS_CASES],
                         ids=[c[0] for c in SUBPROCESS_CASES])
def test_real_process_prints_one_line(tiny_dir, subprocess_runs, request, damage, expected, aside):
    case_id = request.node.callspec.id
    code, stdout, stderr, folder, before = subprocess_runs(case_id)
    assert_one_line(code, stdout, stderr, expected)
    if case_id == "generate-interrupted":
        assert code == 130
    if aside:
        assert not [p for p in (folder / "out" / "checkpoints").iterdir() if p.name.isdigit()]
        assert moved_aside(folder / "out") == {k.removeprefix("out/checkpoints/"): v for k, v in before[0].items()
                                                if k.startswith("out/checkpoints/")}
    else:
        after = digest(folder)
        assert {k: v for k, v in after.items() if k in before[0]} == before[0], case_id
    assert digest(tiny_dir("llama")) == before[1]
