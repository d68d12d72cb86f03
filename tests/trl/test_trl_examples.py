"""TRL's documented GRPO examples (scripts/: the quickstart with a dataset-column reward, conversational data, LoRA
through peft_config, a TrainerCallback that stops training early, a tool, an environment_factory), on a local tiny
model and dataset, run once through TRL 1.16 and once through jaxcore with only the import line changed: the same
optimizer steps, every metric name TRL logs, the same saved files, the same callback hooks."""

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


@pytest.mark.parametrize("script", ["quickstart", "conversational", "lora", "callbacks", "tools", "environment"])
def test_a_trl_example_runs_on_jaxcore_by_changing_its_import(script, tiny_dir, tool_model, tmp_path):
    source = (SCRIPTS / f"{script}.py").read_text()
    assert TRL_IMPORT in source
    model = tool_model if script in ("tools", "environment") else tiny_dir("llama")
    theirs = run_script(source, model, tmp_path / "trl")
    ours = run_script(source.replace(TRL_IMPORT, JAXCORE_IMPORT), model, tmp_path / "jaxcore")
    assert ours["global_step"] == theirs["global_step"]
    if "metrics" in theirs:
        assert set(theirs["metrics"]) <= set(ours["metrics"]), \
            sorted(set(theirs["metrics"]) - set(ours["metrics"]))
    if "calls" in theirs:                          # the callback's hooks, in order, and the rewards it saw
        assert (ours["calls"], ours["rewards_seen"]) == (theirs["calls"], theirs["rewards_seen"])
    if "files" in theirs:
        assert "adapter_config.json" in theirs["files"] and "adapter_config.json" in ours["files"]
        assert PEFT_WEIGHTS & set(theirs["files"]) and PEFT_WEIGHTS & set(ours["files"])
