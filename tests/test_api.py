"""docs/your-task.md ("Bring your own task") works as written: its reward function on both completion
formats, its data + YAML + command (with a tiny model), and its Python snippet (with a tiny model and
out_dir substituted, nothing else changed)."""

import json
import re
import sys
from pathlib import Path

import pytest

from jaxcore.cli import main
from jaxcore.config.yaml_config import load_config
from jaxcore.es.config import ESConfig

ROOT = Path(__file__).resolve().parents[1]
REAL_MODEL = "models/smollm2-135m-instruct"


GUIDE = ROOT / "docs" / "your-task.md"          # the "Bring your own task" guide


def snippet(name: str) -> str:
    """The fenced block under `<!-- byo snippet NAME ... -->` in the guide."""
    text = GUIDE.read_text()
    match = re.search(rf"<!-- byo snippet {re.escape(name)}[ :][^>]*-->\n```\w*\n(.*?)```", text, re.S)
    assert match, f"snippet {name!r} not found in {GUIDE}"
    return match.group(1)


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A user's directory: the guide's my_rewards.py and data, as the current directory and on sys.path
    (as for `python train.py` run there)."""
    (tmp_path / "my_rewards.py").write_text(snippet("my_rewards.py"))
    (tmp_path / "data").mkdir()
    for split in ("train", "eval"):
        (tmp_path / "data" / f"{split}.jsonl").write_text(snippet("data.jsonl"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_readme_reward_function_handles_both_completion_formats():
    namespace: dict = {}
    exec(compile(snippet("my_rewards.py"), "docs/your-task.md", "exec"), namespace)
    brevity = namespace["brevity"]
    prompts = ["What is the capital of France?"] * 3
    assert brevity(prompts, ["Paris.", "The capital of France is Paris.", "Lyon"], answer=["Paris"] * 3) == [
        1.0, 0.0, 0.0]
    chat = [[{"role": "user", "content": "What is the capital of Peru?"}]] * 3
    replies = [[{"role": "assistant", "content": text}] for text in ("Lima", "It is Lima, in Peru.", "Cusco")]
    assert brevity(chat, replies, completion_ids=[[1], [2], [3]], answer=["Lima"] * 3) == [1.0, 0.0, 0.0]
    assert brevity(prompts[:1], ["Paris"], answer=[None]) == [None]


def test_readme_data_config_and_command_run(workdir, tiny_dir, capsys):
    """my.yaml as written (model path, out_dir and sizes overridden for a tiny model and the two data rows)."""
    text = GUIDE.read_text()
    assert ".venv/bin/jaxcore es --config my.yaml" in text and "make smollm2" in text and "make install" in text
    (workdir / "my.yaml").write_text(snippet("my.yaml"))
    cfg = load_config(ESConfig, workdir / "my.yaml", [])
    assert cfg.model.path == REAL_MODEL and cfg.rewards.functions == ["my_rewards.py:brevity", "exact_match"]
    rows = [json.loads(line) for line in snippet("data.jsonl").splitlines()]
    assert isinstance(rows[0]["prompt"], str) and isinstance(rows[1]["prompt"], list)
    out = workdir / "run"
    code = main(["es", "--config", "my.yaml", f"model.path={tiny_dir('llama')}", f"train.out_dir={out}",
                 "rollout.prompts_per_epoch=2", "es.population=8", "train.epochs=2", "train.eval_every=2",
                 "train.progress=false", "train.tensorboard=false", "train.export_hf=false"])
    assert code == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in metrics if "rewards/brevity/mean" in r]
    assert len(trained) == 2 and all(r["rewards/brevity/failures"] == 0 for r in trained)


def test_readme_python_snippet_runs_as_written(workdir, tiny_dir):
    code = snippet("python")
    assert REAL_MODEL in code and "runs/my-es-python" in code
    code = code.replace(REAL_MODEL, str(tiny_dir("llama"))).replace("runs/my-es-python", str(workdir / "out"))
    namespace: dict = {"__name__": "__main__"}
    exec(compile(code, "docs/your-task.md", "exec"), namespace)
    summary = namespace["summary"]
    assert summary["eval_reward_before"] is not None and summary["eval_reward_after"] is not None
    assert Path(summary["final_hf"], "config.json").is_file()
    assert (workdir / "out" / "metrics.jsonl").is_file() and (workdir / "out" / "reward.png").is_file()
