"""`jaxcore.trl.ESConfig` / `ESTrainer`: EGGROLL with the generic TRL arguments where they mean the same thing, ES's
own by name, and the GRPO trainer's surface; a run through it equals the jaxcore job it maps to."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from jaxcore.trl.arguments import TRL_DEFAULTS
from jaxcore.trl.es import ES_DEFAULTS, ES_HANDLED, ES_IGNORED, ES_OWN, ES_REFUSED, ESConfig


def test_every_argument_has_one_handling_and_the_generic_ones_trls_names():
    kinds = [set(ES_HANDLED), set(ES_IGNORED), set(ES_REFUSED)]
    assert set().union(*kinds) == set(ES_DEFAULTS) and sum(map(len, kinds)) == len(ES_DEFAULTS)
    assert set(ES_DEFAULTS) - set(ES_OWN) <= set(TRL_DEFAULTS)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):    # GRPO's, not ES's
        ESConfig(output_dir="x", beta=0.04)


@pytest.mark.parametrize("kwargs, named", [
    ({"population_size": 7}, "population_size=7: must be even"),
    ({"sigma": 0.0}, "sigma"),
    ({"optim": "adafactor"}, "optim='adafactor'"),
    ({"fp16": True}, "fp16=True"),
    ({"temperature": -1.0}, "temperature"),
    ({"optim": "adamw_torch", "momentum": 0.9}, "momentum=0.9 with optim='adamw_torch'"),    # was ignored
])
def test_what_jaxcore_cannot_follow_is_one_line(kwargs, named):
    with pytest.raises(ValueError) as err:
        ESConfig(output_dir="x", **kwargs)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_arguments_reach_the_es_job_config():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ESConfig(output_dir="out", learning_rate=0.05, optim="adamw_torch", lr_scheduler_type="cosine",
                        warmup_steps=0.5, num_train_epochs=2, prompts_per_step=4, population_size=16, sigma=0.02,
                        rank=2, shaping="centered_rank", num_generations=2, temperature=0.7, max_completion_length=12,
                        save_steps=3, seed=5, bf16=True, per_device_train_batch_size=4, logging_steps=2)
    assert len(caught) == 1 and "per_device_train_batch_size" in str(caught[0].message)
    job = args.to_job_config(devices=1, train_rows=10)            # 10 // 4 = 2 steps a pass, 2 passes
    assert (job.train.epochs, job.optimizer.warmup_steps, job.optimizer.name, job.optimizer.schedule) == (
        4, 2, "adamw", "cosine")
    assert (job.es.population, job.es.sigma, job.es.rank, job.es.shaping) == (16, 0.02, 2, "centered_rank")
    assert (job.rollout.prompts_per_epoch, job.rollout.generations_per_prompt, job.rollout.temperature,
            job.rollout.max_new_tokens) == (4, 2, 0.7, 12)
    assert (job.train.checkpoint_every, job.train.seed, job.model.dtype, job.train.out_dir) == (
        3, 5, "bfloat16", "out")
    assert ESConfig(output_dir="x", max_steps=7).to_job_config(1, 100).train.epochs == 7


def test_a_run_through_es_trainer_equals_the_job_it_maps_to(tiny_dir, tmp_path):
    """The same final weights, bit for bit, as jaxcore.api's ESTrainer on `args.to_job_config`; TRL's surface on
    top (state.log_history in steps, evaluate, save_model, a callback's on_log)."""
    from transformers import TrainerCallback

    from jaxcore.api import ESTrainer as JobESTrainer
    from jaxcore.hf.convert import read_safetensors
    from jaxcore.trl import ESTrainer

    logged = []

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(state.global_step)

    def reward_len(completions, **kwargs):
        return [-abs(len(c) - 4.0) for c in completions]

    rows = [{"prompt": f"{a}+{a}="} for a in range(10, 22)]
    kwargs = dict(max_steps=2, population_size=8, prompts_per_step=2, learning_rate=0.05, sigma=0.05,
                  max_completion_length=4, temperature=1.0, report_to="none", save_strategy="no",
                  eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4, disable_tqdm=True)
    trainer = ESTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, train_dataset=rows[:8],
                        eval_dataset=rows[8:], args=ESConfig(output_dir=str(tmp_path / "trl"), **kwargs),
                        callbacks=[Logs])
    out = trainer.train()
    assert out.global_step == trainer.state.global_step == 2 and logged[-2:] == [1, 2]
    assert [e["step"] for e in trainer.state.log_history if "reward" in e] == [1, 2]
    assert any("eval_reward" in e for e in trainer.state.log_history)
    assert set(trainer.evaluate()) == {"eval_reward", "eval_rewards/reward_len/mean"}
    trainer.save_model(str(tmp_path / "saved"))

    job = ESConfig(output_dir=str(tmp_path / "job"), **kwargs).to_job_config(
        devices=trainer.job_trainer.args.train.eval_batch_size // 4, train_rows=8)
    job.train.eval_prompts = 4
    JobESTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, train_dataset=rows[:8],
                 eval_dataset=rows[8:], args=job).train()
    ours, theirs = read_safetensors(tmp_path / "saved"), read_safetensors(tmp_path / "job" / "final_hf")
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    base = read_safetensors(tiny_dir("llama"))
    assert any(not np.array_equal(ours[k], base[k]) for k in ours)             # the run did train


def test_the_docs_page_lists_every_es_argument_as_the_code_maps_it():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    section = page[page.index("<!-- es-arguments:start -->"):page.index("<!-- es-arguments:end -->")]
    for name, text in ES_HANDLED.items():
        assert f"| `{name}` | `{ES_DEFAULTS[name]!r}` | {text} |" in section, name
