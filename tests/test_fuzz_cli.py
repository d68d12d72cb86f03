"""Malformed inputs across the CLIs: each exits non-zero with one stderr line, no traceback, inputs unchanged.

Table-driven: add a row to CASES as (id, cli, argv template). `{model}` is a tiny HF directory, `{tmp}`
a scratch directory holding the files written by `make_files`.
"""

import hashlib
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
    ("es-no-config-file", "jaxcore", ["es", "--config", "{tmp}/missing.yaml"]),
    ("es-bad-yaml", "jaxcore", ["es", "--config", "{tmp}/bad.yaml"]),
    ("es-yaml-not-mapping", "jaxcore", ["es", "--config", "{tmp}/list.yaml"]),
    ("es-wrong-type", "jaxcore", ["es", "--config", "{tmp}/types.yaml"]),
    ("es-unknown-key", "jaxcore", ["es", "model.path={model}", "es.nope=1", "train.out_dir={tmp}/o"]),
    ("es-bad-number", "jaxcore", ["es", "model.path={model}", "es.sigma=abc", "train.out_dir={tmp}/o"]),
    ("es-odd-population", "jaxcore", ["es", "model.path={model}", "es.population=7", "train.out_dir={tmp}/o"]),
    ("es-no-model", "jaxcore", ["es", "train.out_dir={tmp}/o"]),
    ("es-model-not-dir", "jaxcore", ["es", "model.path={tmp}/notdir", "train.out_dir={tmp}/o"]),
    ("es-bad-task", "jaxcore", ["es", "model.path={model}", "task.name=nope", "train.out_dir={tmp}/o"]),
    ("es-resume-nothing", "jaxcore", ["es", "--resume", "model.path={model}", "train.out_dir={tmp}/o",
                                      "train.progress=false"]),
    ("plan-no-config-json", "jaxcore", ["plan", "model.path={tmp}/missing"]),
    ("plan-bad-memory", "jaxcore", ["plan", "model.path={model}", "--device-memory", "lots"]),
    ("plan-bad-mesh", "jaxcore", ["plan", "model.path={model}", "mesh.model=3"]),
    ("plan-bad-yaml", "jaxcore", ["plan", "--config", "{tmp}/bad.yaml"]),
    ("grpo-bad-yaml", "jaxcore", ["grpo", "--config", "{tmp}/bad.yaml"]),
    ("grpo-unknown-key", "jaxcore", ["grpo", "grpo.nope=1"]),
    ("grpo-bad-bool", "jaxcore", ["grpo", "grpo.mask_truncated_completions=maybe"]),
    ("generate-missing-model", "jaxcore", ["generate", "--model", "{tmp}/missing", "--prompt", "hi"]),
    ("generate-no-prompt", "jaxcore", ["generate", "--model", "{model}"]),
    ("generate-bad-prompts-json", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                              "{tmp}/broken.jsonl"]),
    ("generate-prompt-not-string", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                               "{tmp}/prompts.jsonl"]),
    ("generate-empty-prompts", "jaxcore", ["generate", "--model", "{model}", "--prompts-file", "{tmp}/empty.txt"]),
    ("generate-too-many-tokens", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi",
                                             "--max-new-tokens", "100000"]),
    ("generate-long-prompt-no-truncate", "jaxcore", ["generate", "--model", "{model}", "--prompt",
                                                     " ".join(["7"] * 1200), "--no-truncate-prompts"]),
    ("convert-missing", "jaxcore", ["convert", "--from-hf", "{tmp}/missing", "--out", "{tmp}/c"]),
    ("convert-not-dir", "jaxcore", ["convert", "--from-hf", "{tmp}/notdir", "--out", "{tmp}/c"]),
    ("es-bad-flag", "jaxcore", ["es", "--no-such-flag"]),
    ("unknown-command", "jaxcore", ["nope"]),
    ("datagen-missing-questions", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                               "{tmp}/missing.json", "--out", "{tmp}/r.json"]),
    ("datagen-bad-questions", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                           "{tmp}/broken.jsonl", "--out", "{tmp}/r.json"]),
    ("datagen-bad-temperature", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                             "{tmp}/broken.jsonl", "--out", "{tmp}/r.json", "--temperature", "x"]),
    ("datagen-prompt-too-long", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                             "{tmp}/questions.json", "--out", "{tmp}/r.json", "--max-prompt-length",
                                             "4", "--no-truncate-prompts", "--no-progress"]),
    ("train-missing-data", "torchref", ["rft-train", "--model", "{model}", "--data", "{tmp}/missing.json",
                                        "--out", "{tmp}/t"]),
    ("eval-missing-model", "torchref", ["rft-eval", "--model", "{tmp}/missing", "--questions",
                                        "{tmp}/broken.jsonl"]),
    ("data-bad-count", "torchref", ["rft-data", "--out", "{tmp}/d", "--train", "many"]),
]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("cli,argv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_is_one_line(tiny_dir, tmp_path, capsys, cli, argv):
    import jaxcore.cli
    import torchref.cli

    model = tiny_dir("llama")
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    before = digest(tmp_path), digest(Path(model))
    args = [a.format(model=model, tmp=tmp_path) for a in argv]
    capsys.readouterr()
    try:
        code = (jaxcore.cli if cli == "jaxcore" else torchref.cli).main(args)
    except SystemExit as exit_:            # argparse errors
        code = exit_.code
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert code not in (0, None), out
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err + out.out
    after = digest(tmp_path), digest(Path(model))
    assert {k: v for k, v in after[0].items() if k in before[0]} == before[0] and after[1] == before[1]
