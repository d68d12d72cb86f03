"""TRL's documented GRPO examples (scripts/: the quickstart with a dataset-column reward, conversational data, LoRA
through peft_config, a TrainerCallback that stops training early, a tool, an environment_factory, passes over a
dataset with a reward reading trainer_state and calling log_metric), on a local tiny model and dataset, run once
through TRL 1.16 and once through jaxcore with only the import line changed: the same optimizer steps, every metric
name TRL logs, the same saved files, the same callback hooks, the same prompts per pass and the same precision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]
TRL_IMPORT = "from trl import GRPOConfig, GRPOTrainer"
JAXCORE_IMPORT = "from jaxcore.trl import GRPOConfig, GRPOTrainer"
PEFT_WEIGHTS = {"adapter_model.safetensors", "adapter_model.bin"}


def run_script(source: str, model: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}         # one device, as a user has it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", source, str(model), str(out)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tool_model(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model with TRL's Qwen2.5 chat template, which renders tool calls (TRL refuses tools otherwise)."""
    import shutil

    import trl

    model = Path(shutil.copytree(tiny_dir("llama"), tmp_path_factory.mktemp("tools") / "model"))
    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    (model / "chat_template.jinja").write_text(template.read_text())
    return model


SHOUTING_TEMPLATE = (           # a chat template that needs a variable only chat_template_kwargs sets
    "{%- if shout is not defined %}{{ raise_exception('shout is not set') }}{%- endif %}"
    "{%- for message in messages %}{{ message['role'] + ': ' + (message['content'] | upper if shout else "
    "message['content']) + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ 'assistant: ' }}{%- endif %}")


@pytest.fixture(scope="module")
def shouting_model(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model with `SHOUTING_TEMPLATE`."""
    import shutil

    model = Path(shutil.copytree(tiny_dir("llama"), tmp_path_factory.mktemp("shout") / "model"))
    (model / "chat_template.jinja").write_text(SHOUTING_TEMPLATE)
    return model


@pytest.mark.parametrize("script", ["quickstart", "conversational", "lora", "callbacks", "tools", "environment",
                                    "chat_template_kwargs", "log_completions", "rollout_func"])
def test_a_trl_example_runs_on_jaxcore_by_changing_its_import(script, tiny_dir, tool_model, shouting_model, tmp_path):
    source = (SCRIPTS / f"{script}.py").read_text()
    assert TRL_IMPORT in source
    model = {"tools": tool_model, "environment": tool_model, "chat_template_kwargs": shouting_model}.get(
        script, tiny_dir("llama"))
    theirs = run_script(source, model, tmp_path / "trl")
    ours = run_script(source.replace(TRL_IMPORT, JAXCORE_IMPORT), model, tmp_path / "jaxcore")
    assert ours["global_step"] == theirs["global_step"]
    if "metrics" in theirs:
        assert set(theirs["metrics"]) <= set(ours["metrics"]), \
            sorted(set(theirs["metrics"]) - set(ours["metrics"]))
    if "rewards_seen" in theirs:                   # the callback's hooks, in order, and the rewards it saw
        assert (ours["calls"], ours["rewards_seen"]) == (theirs["calls"], theirs["rewards_seen"])
    if "seen" in theirs:                           # rollout_func: rows per call, what the reward saw
        assert (ours["calls"], ours["seen"]) == (theirs["calls"], theirs["seen"])
    if "columns" in theirs:                        # log_completions: the same files, columns, rows and steps
        assert {k: v for k, v in ours.items() if k != "metrics"} == {k: v for k, v in theirs.items() if k != "metrics"}
    elif "files" in theirs:
        assert "adapter_config.json" in theirs["files"] and "adapter_config.json" in ours["files"]
        assert PEFT_WEIGHTS & set(theirs["files"]) and PEFT_WEIGHTS & set(ours["files"])


def test_a_trl_run_and_a_jaxcore_run_walk_the_same_passes_in_the_same_precision(tiny_dir, tmp_path):
    """scripts/passes.py through TRL 1.16 and through jaxcore (the import changed): in both, each of the two passes
    trains every prompt once, shuffled or not; with shuffle_dataset=False both walk the same prompts in the same
    order, and in both runs the reward function gets the same trainer_state and logs the same log_metric values;
    both train in bf16 over float32 weights. (Before: jaxcore refused the function's trainer_state parameter at
    start, drew each generation's prompts independently and trained in float32.)"""
    source = (SCRIPTS / "passes.py").read_text()
    theirs = run_script(source, tiny_dir("llama"), tmp_path / "trl")
    ours = run_script(source.replace(TRL_IMPORT, JAXCORE_IMPORT), tiny_dir("llama"), tmp_path / "jaxcore")
    prompts = sorted(f"Write about the number {i}." for i in range(12))
    for run in (theirs, ours):
        for walk in run.values():
            calls = walk["calls"]
            assert walk["global_step"] == len(calls) == 6
            assert [sorted(sum((c["prompts"] for c in calls[p:p + 3]), [])) for p in (0, 3)] == [prompts, prompts]
        assert [(r["bf16"], r["compute"], r["weights"]) for r in run.values()] == (
            [(True, "bf16", "float32")] * 2 if run is theirs else [(True, "bfloat16", "float32")] * 2)
    assert (ours["ordered"]["calls"], ours["ordered"]["logged"]) == (theirs["ordered"]["calls"],
                                                                     theirs["ordered"]["logged"])
    state = [{k: v for k, v in c.items() if k != "prompts"} for c in theirs["shuffled"]["calls"]]
    assert [{k: v for k, v in c.items() if k != "prompts"} for c in ours["shuffled"]["calls"]] == state


def test_chat_template_kwargs_reach_every_render_of_the_chat_template(shouting_model, tmp_path):
    """The template refuses to render without `shout`: a run without chat_template_kwargs stops at its first render
    (one line), and one with them renders its prompts, its plan's prompt lengths, its tool episodes and its
    evaluation with them."""
    from jaxcore.trl import GRPOConfig, GRPOTrainer

    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b

    def reward_short(completions, **kwargs):
        return [-float(len(str(completion))) for completion in completions]

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} times 7?"}]} for i in range(8)]

    def trainer(out: str, **kwargs) -> GRPOTrainer:
        args = GRPOConfig(output_dir=str(tmp_path / out), per_device_train_batch_size=1, num_generations=4,
                          max_completion_length=6, max_steps=1, report_to="none", save_strategy="no",
                          eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4, disable_tqdm=True,
                          **kwargs)
        return GRPOTrainer(model=str(shouting_model), reward_funcs=reward_short, args=args, train_dataset=rows,
                           eval_dataset=rows[:2], tools=[multiply])

    with pytest.raises(Exception, match="shout is not set") as err:
        trainer("plain").train()
    assert "\n" not in str(err.value)
    shouted = trainer("shout", chat_template_kwargs={"shout": True})
    shouted.train()
    assert any("eval_reward" in entry for entry in shouted.state.log_history)
    with pytest.raises(Exception, match="shout is not set"):      # the process's cached tokenizer is untouched
        trainer("plain_again").train()
