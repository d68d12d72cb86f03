"""Malformed inputs across the CLIs: each exits non-zero with one stderr line naming the problem, no traceback,
inputs and existing checkpoints unchanged.

Table-driven: add a row to CASES as (id, cli, argv template, expected substring of the stderr line). `{model}`
is a tiny HF directory, `{tmp}` a scratch directory holding FILES, `{damaged}` a directory of DAMAGED copies of
the tiny model (weights of another dtype, broken tokenizer files, a jaxcore checkpoint with parts missing or
cut short, a saved dataset with a garbage state.json). A config error comes before any file is read: a case
whose config is bad also writes nothing (no out_dir). Generated cases (every config field across types and
ranges, corruptions of every file a command reads) are in test_fuzz_schema.py. CHECKPOINT_CASES run against an out_dir
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
    # files from the outside world: bad bytes, unpaired surrogates, wrong JSON types
    "latin1.yaml": b"es:\n  shaping: z\xe9score\n",
    "surrogate.yaml": 'rollout:\n  system_prompt: "\\ud800 hi"\n',
    "latin1.txt": b"caf\xe9\n",
    "surrogate.jsonl": '{"prompt": "a \\udc80 b"}\n',
    "latin1.json": b'[{"prompt": "caf\xe9", "answer": "1"}]',
    "surrogate.json": '[' + ", ".join(['{"prompt": "x \\ud83d", "answer": "1"}'] * 4) + ']',
    "surrogate_questions.json": '[["What is \\ud800 12 plus 30?", "42"]]',
    "hf_list/config.json": "[1, 2]",
    "hf_null/config.json": '{"model_type": "llama", "hidden_size": null, "num_hidden_layers": 2}',
    "hf_string/config.json": '{"model_type": "llama", "num_hidden_layers": "2"}',
    "hf_negative/config.json": '{"model_type": "llama", "vocab_size": -5}',
    "hf_nan/config.json": '{"model_type": "llama", "rms_norm_eps": NaN}',
    "hf_latin1/config.json": b'{"model_type": "ll\xe9ma"}',
    "pngdir/reward.png/kept.txt": "an earlier file: reward.png is a directory here",
    "ckptfile/checkpoints": "a file where the checkpoints directory goes",
    "ran/metrics.jsonl": '{"step": 1, "reward": 0.5}\n',          # an earlier run's outputs, no checkpoint
    "twice.yaml": "train:\n  epochs: 5\nes:\n  sigma: 0.01\ntrain:\n  epochs: 1\n",
    "twice_nested.yaml": "train:\n  epochs: 5\n  epochs: 1\n",
    "plotted/reward.png": b"\x89PNG\r\n\x1a\n an earlier run's curve",
}

CASES = [
    ("es-no-config-file", "jaxcore", ["es", "--config", "{tmp}/missing.yaml"],
     "{tmp}/missing.yaml: no such config file"),
    ("es-bad-yaml", "jaxcore", ["es", "--config", "{tmp}/bad.yaml"],
     "bad.yaml: line 2 invalid YAML"),
    # a key twice in one mapping: PyYAML kept the last silently (the first train: section's settings were lost)
    ("es-yaml-key-twice", "jaxcore", ["es", "--config", "{tmp}/twice.yaml"],
     "twice.yaml: line 5: key 'train' appears twice"),
    ("es-yaml-nested-key-twice", "jaxcore", ["es", "--config", "{tmp}/twice_nested.yaml"],
     "twice_nested.yaml: line 3: key 'epochs' appears twice"),
    ("es-config-is-a-device", "jaxcore", ["es", "--config", "/dev/null"],
     "/dev/null: not a regular file (a directory, a device or a pipe): give a config file"),
    ("es-yaml-not-mapping", "jaxcore", ["es", "--config", "{tmp}/list.yaml"],
     "the top level must be a mapping"),
    ("es-wrong-type", "jaxcore", ["es", "--config", "{tmp}/types.yaml"],
     "es.population='many': must be an integer"),
    ("es-unknown-key", "jaxcore", ["es", "model.path={model}", "es.nope=1", "train.out_dir={tmp}/o"],
     "unknown config key es.nope"),
    ("es-bad-number", "jaxcore", ["es", "model.path={model}", "es.sigma=abc", "train.out_dir={tmp}/o"],
     "es.sigma='abc': must be a number"),
    ("es-odd-population", "jaxcore", ["es", "model.path={model}", "es.population=7", "train.out_dir={tmp}/o"],
     "es.population=7: must be even"),
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
    # out_dir/reward.png a directory: refused before training (before: found after all of it)
    ("es-reward-png-is-a-directory", "jaxcore", ["es", "model.path={model}", "train.out_dir={tmp}/pngdir",
                                                  "train.epochs=1", "task.name=addition", "es.population=4"],
     "train.out_dir's reward.png {tmp}/pngdir/reward.png is a directory; a run writes a file at it"),
    # out_dir/checkpoints a file: refused before training (before: found after it, then a hang in orbax's threads)
    # a fresh run over an earlier run's files (before: metrics.jsonl deleted at the start, reward.png overwritten)
    ("es-fresh-over-metrics", "jaxcore", ["es", "model.path={model}", "train.out_dir={tmp}/ran"],
     "train.out_dir {tmp}/ran already holds metrics.jsonl, which a fresh run would replace: pass --resume"),
    ("grpo-fresh-over-reward-png", "jaxcore", ["grpo", "model.path={model}", "train.out_dir={tmp}/plotted"],
     "train.out_dir {tmp}/plotted already holds reward.png, which a fresh run would replace"),
    ("es-checkpoints-is-a-file", "jaxcore", ["es", "model.path={model}", "train.out_dir={tmp}/ckptfile",
                                              "train.epochs=1", "task.name=addition", "es.population=4"],
     "train.out_dir's checkpoints {tmp}/ckptfile/checkpoints is not a directory; a run writes checkpoints in it"),
    # a size that plans nothing (before: NaN, inf and 0 were accepted as a device's memory)
    ("plan-nan-memory", "jaxcore", ["plan", "model.path={model}", "--device-memory", "nan"],
     "device memory 'nan': expected a positive size"),
    ("plan-inf-memory", "jaxcore", ["plan", "model.path={model}", "--device-memory", "infGB"],
     "device memory 'infGB': expected a positive size"),
    ("plan-zero-memory", "jaxcore", ["plan", "model.path={model}", "--device-memory", "0"],
     "device memory '0': expected a positive size"),
    # an unknown bench preset (before: a KeyError deep in the suite, or, with --quick, a run with exit 0)
    ("bench-unknown-preset", "jaxcore", ["bench", "--preset", "nosuch", "--quick", "--suite", "es"],
     "unknown --preset 'nosuch'; choose from tiny, bench"),
    ("plan-bad-mesh", "jaxcore", ["plan", "model.path={model}", "mesh.model=3"],
     "mesh.model=3 does not divide 8 devices"),
    ("plan-bad-yaml", "jaxcore", ["plan", "--config", "{tmp}/bad.yaml"],
     "invalid YAML"),
    ("grpo-bad-yaml", "jaxcore", ["grpo", "--config", "{tmp}/bad.yaml"],
     "invalid YAML"),
    ("grpo-unknown-key", "jaxcore", ["grpo", "grpo.nope=1"],
     "unknown config key grpo.nope"),
    ("grpo-bad-bool", "jaxcore", ["grpo", "grpo.mask_truncated_completions=maybe"],
     "grpo.mask_truncated_completions='maybe': must be true or false"),
    ("generate-missing-model", "jaxcore", ["generate", "--model", "{tmp}/missing", "--prompt", "hi"],
     "{tmp}/missing: neither an HF model directory"),
    ("generate-no-prompt", "jaxcore", ["generate", "--model", "{model}"],
     "give --prompt or --prompts-file"),
    ("generate-bad-prompts-json", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                              "{tmp}/broken.jsonl"],
     "broken.jsonl:1: invalid JSON"),
    ("generate-prompt-not-string", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                               "{tmp}/prompts.jsonl"],
     "prompts.jsonl:1: missing field 'prompt' (a string, or a conversation"),
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
    # ---- config values out of their declared range (issue 24, item 8): refused before any model is loaded
    *[(f"es-{key}={value}", "jaxcore", ["es", "model.path={model}", f"{key}={value}", "train.out_dir={tmp}/o"],
       f"{key}={shown}: must be {allowed}") for key, value, shown, allowed in [
        ("rollout.max_new_tokens", "0", "0", ">= 1"),
        ("rollout.temperature", "-1", "-1", ">= 0"),
        ("rollout.prompts_per_epoch", "0", "0", ">= 1"),
        ("train.eval_batch_size", "0", "0", ">= 1"),
        ("train.eval_prompts", "-1", "-1", ">= 1"),
        ("train.seed", "-1", "-1", ">= 0"),
        ("train.epochs", "-3", "-3", ">= 1"),
        ("rewards.timeout_s", "0", "0", "> 0"),
        ("es.shaping", "bogus", "'bogus'", "'zscore', 'group_zscore', 'centered_rank' or 'none'"),
        ("model.dtype", "bogus", "'bogus'", "'float32' or 'bfloat16'"),
        ("rollout.top_p", "0", "0", "> 0"),
        ("es.sigma", ".nan", "nan", "a finite number"),
        ("optimizer.name", "lion", "'lion'", "'sgd', 'adam' or 'adamw'"),
    ]],
    ("grpo-accumulation-zero", "jaxcore", ["grpo", "model.path={model}", "grpo.gradient_accumulation_steps=0",
                                           "train.out_dir={tmp}/o"],
     "grpo.gradient_accumulation_steps=0: must be >= 1"),
    ("grpo-lora-rank-zero", "jaxcore", ["grpo", "model.path={model}", "grpo.lora={{rank: 0}}", "train.out_dir={tmp}/o"],
     "grpo.lora.rank=0: must be >= 1"),
    ("es-config-error-before-missing-model", "jaxcore", ["es", "model.path={tmp}/missing", "train.epochs=-3",
                                                        "train.out_dir={tmp}/o"],
     "train.epochs=-3: must be >= 1"),
    ("es-section-not-mapping", "jaxcore", ["es", "model.path={model}", "es=5", "train.out_dir={tmp}/o"],
     "es=5: must be a section (EggrollConfig)"),
    ("es-weights-not-numbers", "jaxcore", ["es", "model.path={model}", "rewards.functions=[exact_match]",
                                           "rewards.weights=[1, x]", "train.out_dir={tmp}/o"],
     "rewards.weights[1]='x': must be a number"),
    ("es-quoted-integer", "jaxcore", ["es", "model.path={model}", "es.population='4'", "train.out_dir={tmp}/o"],
     "es.population='4': must be an integer"),
    ("es-process-id-past-processes", "jaxcore", ["es", "model.path={model}", "distributed.process_id=2",
                                                 "train.out_dir={tmp}/o"],
     "distributed.process_id=2 must be < num_processes=1"),
    ("plan-negative-population", "jaxcore", ["plan", "model.path={model}", "es.population=-4"],
     "es.population=-4: must be >= 2"),
    ("plan-negative-length", "jaxcore", ["plan", "model.path={model}", "rollout.max_new_tokens=-5"],
     "rollout.max_new_tokens=-5: must be >= 1"),
    ("plan-negative-prompt-tokens", "jaxcore", ["plan", "model.path={model}", "--prompt-tokens", "-3"],
     "argument --prompt-tokens: must be >= 1, got '-3'"),
    ("plan-zero-devices", "jaxcore", ["plan", "model.path={model}", "--devices", "0"],
     "argument --devices: must be >= 1, got '0'"),
    ("generate-negative-batch", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi", "--batch-size", "-1"],
     "argument --batch-size: must be >= 1, got '-1'"),
    ("generate-negative-prompt-length", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi",
                                                    "--max-prompt-length", "-2"],
     "argument --max-prompt-length: must be >= 1, got '-2'"),
    ("generate-nan-temperature", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi", "--temperature",
                                             "nan"],
     "argument --temperature: must be a finite number, got 'nan'"),
    ("generate-top-p-above-one", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi", "--top-p", "1.5"],
     "argument --top-p: must be <= 1, got '1.5'"),
    ("generate-bad-dtype", "jaxcore", ["generate", "--model", "{model}", "--prompt", "hi", "--dtype", "float8"],
     "argument --dtype: must be 'float32' or 'bfloat16', got 'float8'"),
    ("demo-odd-population", "jaxcore", ["demo", "--population", "7", "--out", "{tmp}/demo"],
     "argument --population: must be even, got '7'"),
    ("train-dropout-above-one", "torchref", ["rft-train", "--model", "{model}", "--data", "{tmp}/questions.json",
                                             "--out", "{tmp}/t", "--lora-dropout", "1.5"],
     "lora_dropout=1.5: must be < 1"),
    # ---- files from the outside world (item 9): one line naming the file and the problem
    ("es-yaml-not-utf8", "jaxcore", ["es", "--config", "{tmp}/latin1.yaml"], "latin1.yaml: not UTF-8 text"),
    ("es-yaml-surrogate", "jaxcore", ["es", "--config", "{tmp}/surrogate.yaml", "model.path={model}"],
     "rollout.system_prompt: unpaired surrogate '\\ud800'"),
    ("generate-prompts-not-utf8", "jaxcore", ["generate", "--model", "{model}", "--prompts-file", "{tmp}/latin1.txt"],
     "latin1.txt: not UTF-8 text"),
    ("generate-prompts-surrogate", "jaxcore", ["generate", "--model", "{model}", "--prompts-file",
                                               "{tmp}/surrogate.jsonl"],
     "surrogate.jsonl:1: field 'prompt': unpaired surrogate"),
    ("es-dataset-not-utf8", "jaxcore", ["es", "model.path={model}", "task.name=file",
                                        "task.options={{path: {tmp}/latin1.json}}", "train.out_dir={tmp}/o"],
     "latin1.json: cannot read file"),
    ("es-dataset-surrogate", "jaxcore", ["es", "model.path={model}", "task.name=file",
                                         "task.options={{path: {tmp}/surrogate.json}}", "train.out_dir={tmp}/o"],
     "surrogate.json: record [0]: field 'prompt': unpaired surrogate"),
    ("es-dataset-garbage-state", "jaxcore", ["es", "model.path={model}", "task.name=file",
                                             "task.options={{path: {damaged}/dataset}}", "train.out_dir={tmp}/o"],
     "dataset/state.json: invalid JSON"),
    ("datagen-questions-surrogate", "torchref", ["rft-datagen", "--model", "{model}", "--questions",
                                                 "{tmp}/surrogate_questions.json", "--out", "{tmp}/r.json"],
     "surrogate_questions.json: entry [0]: unpaired surrogate"),
    *[(f"{cmd[0]}-config-json-{kind}", "jaxcore", [*cmd, *(["--prompt", "hi"] if cmd[0] == "generate" else [])],
       expected) for kind, expected in [
        ("list", "hf_list/config.json: must be a JSON object, got list"),
        ("null", "hf_null/config.json: hidden_size=None: must be an integer"),
        ("string", "hf_string/config.json: num_hidden_layers='2': must be an integer"),
        ("negative", "hf_negative/config.json: vocab_size=-5: must be >= 1"),
        ("nan", "hf_nan/config.json: rms_norm_eps=nan: must be a finite number"),
        ("latin1", "hf_latin1/config.json: not UTF-8 text")]
       for cmd in (["generate", "--model", f"{{tmp}}/hf_{kind}"], ["convert", "--from-hf", f"{{tmp}}/hf_{kind}",
                                                                    "--out", "{tmp}/c"],
                   ["plan", f"model.path={{tmp}}/hf_{kind}"])],
    ("plan-model-config-json-list", "jaxcore", ["plan", "--model-config", "{tmp}/hf_list/config.json"],
     "hf_list/config.json: must be a JSON object, got list"),
    ("generate-weights-int16", "jaxcore", ["generate", "--model", "{damaged}/int16", "--prompt", "hi"],
     "model.safetensors: tensor lm_head.weight has dtype I16"),
    # a chat template that refuses a conversation (before: "unexpected TemplateError", no prompt named)
    ("generate-template-refuses-system", "jaxcore", ["generate", "--model", "{damaged}/strict_template", "--prompt",
                                                     "hi there", "--chat-template", "--system", "Be brief."],
     "the chat template refuses the conversation (system/user) that starts 'Be brief.': System role not supported"),
    ("generate-tokenizer-truncated", "jaxcore", ["generate", "--model", "{damaged}/tokenizer_cut", "--prompt", "hi"],
     "tokenizer_cut/tokenizer.json: invalid JSON"),
    ("generate-tokenizer-not-utf8", "jaxcore", ["generate", "--model", "{damaged}/tokenizer_latin1", "--prompt", "hi"],
     "tokenizer_latin1/tokenizer.json: not UTF-8 text"),
    ("generate-tokenizer-wrong-shape", "jaxcore", ["generate", "--model", "{damaged}/tokenizer_shape", "--prompt",
                                                   "hi"],
     "tokenizer_shape: cannot load the tokenizer from tokenizer.json"),
    ("convert-checkpoint-no-metadata", "jaxcore", ["convert", "--to-hf", "{damaged}/ckpt_no_meta", "--out", "{tmp}/h"],
     "ckpt_no_meta/params: damaged or incomplete orbax checkpoint"),
    ("convert-checkpoint-cut-metadata", "jaxcore", ["convert", "--to-hf", "{damaged}/ckpt_cut_meta", "--out",
                                                    "{tmp}/h"],
     "ckpt_cut_meta/params: damaged or incomplete orbax checkpoint"),
    ("convert-checkpoint-cut-arrays", "jaxcore", ["convert", "--to-hf", "{damaged}/ckpt_cut_arrays", "--out",
                                                  "{tmp}/h"],
     "ckpt_cut_arrays/params: damaged or incomplete orbax checkpoint"),
    ("convert-checkpoint-meta-list", "jaxcore", ["convert", "--to-hf", "{damaged}/ckpt_meta_list", "--out", "{tmp}/h"],
     "ckpt_meta_list/jaxcore.json: must be a JSON object, got list"),
    ("convert-checkpoint-hf-config-null", "jaxcore", ["convert", "--to-hf", "{damaged}/ckpt_null_size", "--out",
                                                      "{tmp}/h"],
     "ckpt_null_size/jaxcore.json hf_config: hidden_size=None: must be an integer"),
]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_files(folder: Path) -> None:
    for name, content in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)


@pytest.fixture(scope="module")
def damaged(tiny_dir, tmp_path_factory) -> Path:
    """Damaged copies of the tiny model's files (see the module docstring), made once per module."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    import jaxcore
    from jaxcore.hf.model_checkpoint import save_model

    model, root = tiny_dir("llama"), tmp_path_factory.mktemp("damaged")

    def copy(name: str) -> Path:
        return Path(shutil.copytree(model, root / name))

    weights = load_file(str(copy("int16") / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"].astype(np.int16)
    save_file(weights, str(root / "int16" / "model.safetensors"))
    tokenizer = (model / "tokenizer.json").read_text()
    (copy("tokenizer_cut") / "tokenizer.json").write_text(tokenizer[: len(tokenizer) // 2])
    (copy("tokenizer_latin1") / "tokenizer.json").write_bytes(b'{"version": "1.0", "x": "\xe9"}')
    (copy("tokenizer_shape") / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    (copy("strict_template") / "chat_template.jinja").write_text(        # Gemma-style: no system turn
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
        "{% endif %}")
    checkpoint = save_model(jaxcore.load_hf(model), root / "ckpt", tokenizer_dir=model)
    for name in ("ckpt_no_meta", "ckpt_cut_meta", "ckpt_cut_arrays", "ckpt_meta_list", "ckpt_null_size"):
        shutil.copytree(checkpoint, root / name)
    (root / "ckpt_no_meta" / "params" / "_METADATA").unlink()
    cut = root / "ckpt_cut_meta" / "params" / "_METADATA"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    arrays = [f for f in (root / "ckpt_cut_arrays" / "params").rglob("*") if f.is_file() and f.parent.name == "d"]
    for f in arrays:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    (root / "ckpt_meta_list" / "jaxcore.json").write_text("[]")
    meta_file = root / "ckpt_null_size" / "jaxcore.json"
    meta = json.loads(meta_file.read_text())
    meta["hf_config"]["hidden_size"] = None
    meta_file.write_text(json.dumps(meta))
    dataset = root / "dataset"
    dataset.mkdir()
    (dataset / "state.json").write_text("garbage{")
    (dataset / "dataset_info.json").write_text("{}")
    return root


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
def test_malformed_input_is_one_line(tiny_dir, tmp_path, capsys, subprocess_runs, damaged, cli, argv, expected):
    # (subprocess_runs: requested here only so the real processes start first and run alongside these cases)
    model = tiny_dir("llama")
    write_files(tmp_path)
    before = digest(tmp_path), digest(Path(model)), digest(damaged)
    args = [a.format(model=model, tmp=tmp_path, damaged=damaged) for a in argv]
    code, out = call_cli(capsys, cli, args)
    assert_one_line(code, out.out, out.err, expected.format(model=model, tmp=tmp_path))
    after = digest(tmp_path), digest(Path(model)), digest(damaged)
    assert {k: v for k, v in after[0].items() if k in before[0]} == before[0] and after[1:] == before[1:]
    if ": must be " in expected:                     # a config or flag value: refused before anything is written
        assert digest(tmp_path).keys() == before[0].keys()


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
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    model_dir = tiny_dir("llama")
    model, tokenizer = jaxcore.load_hf(model_dir), load_tokenizer(model_dir)
    cfg = load_config(ESConfig, None, es_overrides(model_dir, Path("unused")))
    algorithm = EggrollAlgorithm(model, tokenizer, cfg, eos_token_ids=eos_token_ids(tokenizer, model.config.hf_config))
    task = make_task(cfg.task, cfg.rewards.functions, cfg.rewards.weights)

    def write(out: Path) -> Path:
        runner = Runner(load_config(ESConfig, None, es_overrides(model_dir, out)), algorithm, task)
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
