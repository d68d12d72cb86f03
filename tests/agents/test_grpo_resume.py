"""A TRL-style environment class (`trl_tools.py`) trains unchanged with `GRPOTrainer` (objects, as in TRL's
Python API), and a multi-turn GRPO run resumed mid-run equals the straight run (the counting episode of
`counting.py`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import trl_tools  # noqa: E402
from counting import HELD_OUT, TRAIN, logged  # noqa: E402

from jaxcore import GRPOConfig, GRPOTrainer  # noqa: E402


def configure(args, out: Path, epochs: int = 2):
    r, t = args.rollout, args.train
    r.prompts_per_epoch, r.max_new_tokens, r.max_episode_tokens = 2, 72, 128
    t.epochs, t.out_dir, t.eval_every, t.eval_prompts, t.checkpoint_every = epochs, str(out), epochs, 2, 1
    t.tensorboard = t.progress = False
    return args


def grpo_run(make_model, path, out: Path, resume: bool = False) -> dict:
    args = configure(GRPOConfig(), out)
    args.rollout.generations_per_prompt = 4
    args.grpo.num_iterations = 2                    # old log-probs from the rollout: tool tokens' are 0, masked
    trainer = GRPOTrainer(make_model(), [trl_tools.said_done], TRAIN, HELD_OUT, args, tokenizer=str(path),
                          tools=[trl_tools.add], environment_factory=trl_tools.IncrementEnv)
    return trainer.train(resume=resume)


def test_grpo_trains_a_trl_environment_and_resumes_mid_run_exactly(make_model, path, tmp_path):
    from cli_runs import final_params

    straight = tmp_path / "straight"
    grpo_run(make_model, path, straight)
    rows = [r for r in logged(straight) if "reward" in r]
    assert [r["tools/call_frequency"] for r in rows] == [1.0, 1.0]
    assert all(r["rewards/IncrementEnv/std"] > 0 for r in rows)            # the sampled steps differ: a signal
    # TRL's completion length counts the model's tokens only (the tool message is not the model's)
    assert all(r["completions/mean_length"] < r["episodes/length_mean"] for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)            # the generated tokens' gradient reaches the weights
    trained = final_params(straight)

    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "1")
    shutil.rmtree(resumed / "final_hf")
    grpo_run(make_model, path, resumed, resume=True)
    again = final_params(resumed)
    assert again.keys() == trained.keys()
    for key, value in trained.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)
