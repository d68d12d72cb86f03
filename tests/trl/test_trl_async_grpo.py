"""`jaxcore.trl.AsyncGRPOConfig` and `AsyncGRPOTrainer` against the installed TRL 1.16's `experimental.async_grpo`:
every argument by TRL's name and default, each mapped, accepted with one warning or refused in one line, TRL's
accounting of one fixed-count batch per optimizer step, the docs table generated from the code, and the trainer on
jaxcore's asynchronous runner."""

from __future__ import annotations

import dataclasses
import inspect
import os
import warnings
from pathlib import Path

import pytest

from jaxcore.grpo.async_config import AsyncOptions
from jaxcore.trl.async_grpo import (
    ASYNC_DEFAULTS,
    ASYNC_HANDLED,
    ASYNC_IGNORED,
    ASYNC_REFUSED,
    JAXCORE_OWN,
    TRL_ASYNC_DEFAULTS,
    AsyncGRPOConfig,
    arguments_markdown,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl_async = pytest.importorskip("trl.experimental.async_grpo")


def test_every_trl_argument_has_trls_default_and_exactly_one_handling():
    fields = {f.name: f for f in dataclasses.fields(trl_async.AsyncGRPOConfig)}
    assert list(fields) == list(TRL_ASYNC_DEFAULTS)
    for name, field in fields.items():
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert TRL_ASYNC_DEFAULTS[name] == default, name
    assert set(ASYNC_DEFAULTS) == set(TRL_ASYNC_DEFAULTS) | set(JAXCORE_OWN)
    kinds = [set(ASYNC_HANDLED), set(ASYNC_IGNORED), set(ASYNC_REFUSED)]
    assert set().union(*kinds) == set(ASYNC_DEFAULTS)
    assert sum(len(k) for k in kinds) == len(ASYNC_DEFAULTS)


def test_the_trainer_takes_trls_constructor():
    from jaxcore.trl import AsyncGRPOTrainer

    theirs = list(inspect.signature(trl_async.AsyncGRPOTrainer.__init__).parameters)
    assert list(inspect.signature(AsyncGRPOTrainer.__init__).parameters) == theirs


def test_an_argument_trl_does_not_have_is_trls_type_error():
    with pytest.raises(TypeError) as theirs:
        trl_async.AsyncGRPOConfig(output_dir="x", num_generation=8)
    with pytest.raises(TypeError) as ours:
        AsyncGRPOConfig(output_dir="x", num_generation=8)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        AsyncGRPOConfig(output_dir="x", beta=0.04)            # GRPOConfig's, not AsyncGRPOConfig's


def test_the_vllm_server_settings_warn_once_naming_each():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncGRPOConfig(output_dir="x", vllm_server_base_url="http://gpu7:8000", request_timeout=60,
                        max_inflight_tasks=64, fork_threshold_tokens=10, seed=3)
    assert len(caught) == 1
    text = str(caught[0].message)
    for name in ("vllm_server_base_url (", "request_timeout (", "max_inflight_tasks (", "fork_threshold_tokens ("):
        assert name in text
    assert "seed" not in text and "\n" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AsyncGRPOConfig(output_dir="x", vllm_server_base_url="http://localhost:8000", token_budget=0)


@pytest.mark.parametrize("kwargs, named", [
    ({"dtype": "bfloat16"}, "dtype='bfloat16'"),
    ({"fp16": True}, "fp16=True"),
    ({"optim": "adafactor"}, "optim='adafactor'"),
    ({"auto_find_batch_size": True}, "auto_find_batch_size=True"),
    ({"router_aux_loss_coef": 0.01}, "router_aux_loss_coef=0.01"),
    ({"max_staleness": -1}, "max_staleness=-1: must be >= 0"),
    ({"weight_sync_steps": 0}, "weight_sync_steps=0: must be >= 1"),
    ({"async_mode": "eager"}, "async_mode='eager': must be 'deterministic' or 'free_running'"),
    ({"rollout_devices": 0}, "rollout_devices=0: must be >= 1"),
    ({"epsilon": -0.1}, "epsilon=-0.1"),
])
def test_what_jaxcore_cannot_follow_is_one_line_naming_the_argument(kwargs, named):
    with pytest.raises(ValueError) as err:
        AsyncGRPOConfig(output_dir="x", **kwargs)
    assert named in str(err.value) and "\n" not in str(err.value)
    assert "grpo." not in str(err.value)                     # TRL's names, not the job config's keys


def test_token_budget_maps_to_packed_rows():
    """TRL's token_budget > 0 is grpo.token_budget (rows of that many slots, shared tokens once); None or <= 0 is
    fixed-count batches, each prompt once per tree."""
    def budget(value):
        return AsyncGRPOConfig(output_dir="x", token_budget=value, max_steps=2).to_job_config(4).grpo.token_budget

    assert budget(4096) == 4096
    assert all(budget(unset) is None for unset in (None, 0, -1))


def test_one_fixed_count_batch_per_optimizer_step():
    """TRL's FixedCountBatcher: per_device_train_batch_size x (training) processes samples per micro-batch,
    gradient_accumulation_steps of them per optimizer step; num_train_epochs passes over the prompts."""
    args = AsyncGRPOConfig(output_dir="x", per_device_train_batch_size=4, num_generations=4,
                           gradient_accumulation_steps=2, num_train_epochs=2, epsilon_high=0.28, max_staleness=1,
                           weight_sync_steps=2, rollout_devices=4)
    job = args.to_job_config(devices=8, train_rows=20)
    assert job.rollout.prompts_per_epoch == 4 * 4 * 2 // 4 == 8
    assert job.rollout.generations_per_prompt == 4
    assert job.train.epochs == 5                              # ceil(2 passes x 20 prompts / 8 per step)
    assert (job.grpo.gradient_accumulation_steps, job.grpo.steps_per_generation, job.grpo.num_iterations) == (2, 2, 1)
    assert (job.grpo.epsilon, job.grpo.epsilon_high) == (0.2, 0.28)
    assert job.grpo.asynchronous == AsyncOptions(rollout_devices=4, max_staleness=1, weight_sync_steps=2,
                                                 mode="deterministic")
    assert job.optimizer.schedule == "constant" and job.optimizer.learning_rate == 1e-6    # TRL async's defaults
    assert job.rollout.max_new_tokens == 2048 and job.train.shuffle is False
    assert args.to_job_config(devices=8, train_rows=20).rollout.prompts_per_epoch == 8
    assert AsyncGRPOConfig(output_dir="x", max_steps=3, per_device_train_batch_size=4,
                           num_generations=4).to_job_config(devices=2).train.epochs == 3


def test_a_step_of_whole_groups_and_a_training_device_on_the_run_s_devices_or_one_line():
    args = AsyncGRPOConfig(output_dir="x", per_device_train_batch_size=4, num_generations=3)   # on 3 devices: fine
    with pytest.raises(ValueError, match=r"= 4 completions per optimizer step must be a multiple of num_generations "
                                         r"\(3\)"):
        args.to_job_config(devices=2, train_rows=16)
    args = AsyncGRPOConfig(output_dir="x", rollout_devices=4, per_device_train_batch_size=8, num_generations=8)
    assert args.to_job_config(devices=6, train_rows=16).rollout.prompts_per_epoch == 2
    with pytest.raises(ValueError) as err:
        args.to_job_config(devices=4, train_rows=16)
    assert str(err.value) == ("AsyncGRPOConfig: rollout_devices=4: must leave at least one of the 4 devices to train "
                              "(generation and training run on disjoint device groups)")


def test_the_docs_page_has_the_tables_the_code_generates():
    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    block = page.split("<!-- async-grpo-arguments:start -->\n")[1].split("<!-- async-grpo-arguments:end -->")[0]
    assert block == arguments_markdown(), (
        "docs/coming-from-trl.md's AsyncGRPOConfig tables are stale: replace the block with "
        "jaxcore.trl.async_grpo.arguments_markdown()")


def prompts(n: int) -> list[dict[str, str]]:
    return [{"prompt": f"say {i}"} for i in range(n)]


def reward(completions, **kwargs):
    return [0.0] * len(completions)


def test_the_trainer_trains_on_the_asynchronous_runner_and_refuses_what_it_cannot_run(tiny_dir, tmp_path):
    """4 of the 8 simulated devices generate, 4 train: two optimizer steps, each on one group of 4 completions
    (per_device_train_batch_size 1 x 4 training devices), with TRL's staleness logged."""
    from jaxcore.trl import AsyncGRPOTrainer

    args = AsyncGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1, num_generations=4,
                           max_steps=2, max_completion_length=4, max_staleness=1, report_to="none",
                           save_strategy="no", disable_tqdm=True)
    trainer = AsyncGRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward, args=args,
                               train_dataset=prompts(16))
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "sample/staleness_max" in entry]
    assert [entry["sample/staleness_max"] for entry in logged] == [0.0, 1.0]
    assert trainer.state.global_step == 2
    args = AsyncGRPOConfig(output_dir="x", per_device_train_batch_size=4, num_generations=4, max_steps=2)
    with pytest.raises(ValueError, match="not supported by jaxcore: rollout_worker"):
        AsyncGRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward, args=args, train_dataset=prompts(16),
                         rollout_worker=object())
    with pytest.raises(ValueError, match="rollout_devices=8: must leave at least one of the 8 devices"):
        AsyncGRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward, train_dataset=prompts(16),
                         args=AsyncGRPOConfig(output_dir="x", rollout_devices=8, per_device_train_batch_size=8,
                                              max_steps=2))
