"""A TRL-style tool function and environment class (`trl_tools.py`) train unchanged with `jaxcore es`, named by
spec strings as a YAML config names them; every population member's rows get their own instances (the
counting episode of `counting.py`); a TRL reward function reading `environments` gets each row's instance, with
the other reward function in a worker process; and an environment's get_reward alone may score a run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import trl_tools  # noqa: E402
from counting import HELD_OUT, TRAIN, logged  # noqa: E402

TOOLS = Path(trl_tools.__file__)


def jaxcore_es(make_model, path, tmp_path, train: list[dict], *overrides: str) -> list[dict]:
    """`jaxcore es` on the counting episode with the tool and the environment as spec strings (`rollout.tools`,
    `rollout.environment_factory`), the way a YAML config names them; the logged metrics."""
    from jaxcore.cli import main
    from jaxcore.hf.convert import save_hf

    model_dir = save_hf(make_model(), tmp_path / "scripted", tokenizer_dir=path)
    data = {}
    for name, rows in (("train", train), ("eval", HELD_OUT)):
        data[name] = tmp_path / f"{name}.jsonl"
        data[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "es"
    code = main(["es", f"model.path={model_dir}", "task.name=file", f"task.options.path={data['train']}",
                 f"task.options.eval_path={data['eval']}",
                 f"rollout.tools=[{TOOLS}:add]", f"rollout.environment_factory={TOOLS}:IncrementEnv",
                 "rollout.prompts_per_epoch=2", "rollout.max_new_tokens=72", "rollout.max_episode_tokens=128",
                 "es.population=8", "train.epochs=2", "train.eval_every=2", "train.eval_prompts=2",
                 f"train.out_dir={out}", "train.tensorboard=false", "train.progress=false", "train.export_hf=false",
                 *overrides])
    assert code == 0
    return logged(out)


def test_jaxcore_es_trains_a_trl_tool_and_environment_with_an_instance_per_member_row(make_model, path, tmp_path):
    rows = jaxcore_es(make_model, path, tmp_path, TRAIN, f"rewards.functions=[{TOOLS}:said_done,{TOOLS}:counted]",
                      "rewards.num_workers=1")
    epochs = [r for r in rows if "reward" in r]
    assert len(epochs) == 2
    for r in epochs:
        assert r["tools/call_frequency"] == 1.0 and r["tools/failures"] == 0 and r["episodes/turns_mean"] == 2.0
        assert r["rewards/said_done/mean"] == 1.0
        # 16 episodes (8 members x 2 prompts), each with its own counter: a step of 2 or 4 each, never summed
        assert 2.0 <= r["rewards/IncrementEnv/mean"] <= 4.0
        assert r["rewards/counted/mean"] == r["rewards/IncrementEnv/mean"] and r["rewards/counted/failures"] == 0
    assert rows[0]["eval/episodes/turns_mean"] == 2.0 and "eval/rewards/IncrementEnv/mean" in rows[0]
    assert rows[0]["eval/rewards/counted/mean"] == rows[0]["eval/rewards/IncrementEnv/mean"]


def test_an_environment_that_scores_needs_no_reward_functions(make_model, path, tmp_path):
    """As in TRL, get_reward alone scores the run: no rewards.functions, and a file task without an answer column
    (its default exact_match, which needs one, is not used)."""
    rows = jaxcore_es(make_model, path, tmp_path, [{"prompt": r["prompt"]} for r in TRAIN])
    for r in [r for r in rows if "reward" in r]:
        assert r["reward"] == r["rewards/IncrementEnv/mean"] and 2.0 <= r["reward"] <= 4.0
        assert not [k for k in r if k.startswith("rewards/") and "IncrementEnv" not in k]


def test_the_completions_log_shows_each_prompt_with_its_resets_text(make_model, path, tmp_path):
    """As TRL logs them: a row's prompt is the one the model saw, the environment's reset() text appended (before:
    the dataset's prompt alone)."""
    import pandas as pd

    jaxcore_es(make_model, path, tmp_path, TRAIN, f"rewards.functions=[{TOOLS}:said_done]", "train.eval_every=-1",
               "train.log_completions=true")
    files = sorted((tmp_path / "es" / "completions").glob("*.parquet"))
    assert files
    for file in files:
        prompts = pd.read_parquet(file)["prompt"].tolist()
        assert len(prompts) == 16 and all("The counter starts at 0." in str(p) for p in prompts), prompts[:2]
