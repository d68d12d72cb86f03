"""Helpers the CLI tests of several packages share: tiny runs of `jaxcore es`, `jaxcore grpo` and
`torchref rft-datagen`."""

from pathlib import Path

from jaxcore.cli import main
from jaxcore.hf.convert import read_safetensors

TINY_RUN = ["task.name=addition", "task.options.digit_match_weight=1.0", "rollout.temperature=1.0",
            "rollout.prompts_per_epoch=2", "rollout.max_new_tokens=3", "es.population=16",
            "optimizer.learning_rate=0.05", "train.eval_prompts=8", "train.progress=false", "train.tensorboard=false"]


GRPO_TINY_RUN = ["task.name=addition", "task.options.digit_match_weight=1.0", "rollout.prompts_per_epoch=4",
                 "rollout.generations_per_prompt=4", "rollout.max_new_tokens=3", "optimizer.learning_rate=0.01",
                 "train.eval_prompts=8", "train.progress=false", "train.tensorboard=false"]


def es_args(model, out, *extra):
    return [f"model.path={model}", f"train.out_dir={out}", *TINY_RUN, *extra]


def grpo_args(model, out, *extra) -> list[str]:
    return [f"model.path={model}", f"train.out_dir={out}", *GRPO_TINY_RUN, *extra]


def phases_within(parts: float, step_time: float) -> bool:
    """An epoch's timed phases are parts of its step: together never more than its step_time (a phase counted twice,
    or compile time counted inside a phase and again apart, would be). How much of the step they cover is a matter
    of timing, which a loaded machine changes, so it is not tested."""
    return parts <= step_time + 1e-3


def final_params(out: Path) -> dict:
    return read_safetensors(out / "final_hf")


def run_cli(capsys, *args):
    capsys.readouterr()
    code = main(list(map(str, args)))
    return code, capsys.readouterr().err.strip().splitlines()


def run_datagen(capsys, model, questions_file, out, *extra):
    from torchref.cli import main as torchref_main

    capsys.readouterr()
    code = torchref_main(["rft-datagen", "--model", str(model), "--questions", str(questions_file), "--out", str(out),
                          "--oversample", "3", "--max-new-tokens", "8", "--batch-size", "2", "--micro-batch-size", "4",
                          "--chunk-size", "2", "--no-progress", *map(str, extra)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()
