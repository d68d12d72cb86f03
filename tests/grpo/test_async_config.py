"""The `grpo.asynchronous` section: TRL's meanings and defaults, one-line errors, the device groups, and a run with
it set refused in one line where the asynchronous runner does not run it yet (never a synchronous run under its
name)."""

from __future__ import annotations

import pytest

from jaxcore.config.yaml_config import load_config
from jaxcore.errors import ConfigValueError
from jaxcore.grpo.async_config import AsyncOptions
from jaxcore.grpo.config import GRPOConfig


def test_the_section_is_off_by_default_and_takes_trls_defaults_when_set():
    assert GRPOConfig().grpo.asynchronous is None
    cfg = load_config(GRPOConfig, None, ["grpo.asynchronous={}"])
    assert cfg.grpo.asynchronous == AsyncOptions(rollout_devices=None, max_staleness=4, weight_sync_steps=1,
                                                 mode="deterministic")
    cfg = load_config(GRPOConfig, None, ["grpo.asynchronous.rollout_devices=4", "grpo.asynchronous.max_staleness=1",
                                         "grpo.asynchronous.weight_sync_steps=2",
                                         "grpo.asynchronous.mode=free_running"])
    assert cfg.grpo.asynchronous == AsyncOptions(4, 1, 2, "free_running")
    assert load_config(GRPOConfig, None, ["grpo.asynchronous=null"]).grpo.asynchronous is None


def test_trls_defaults_are_its_async_configs():
    import dataclasses

    trl_config = pytest.importorskip("trl.experimental.async_grpo").AsyncGRPOConfig
    theirs = {f.name: f.default for f in dataclasses.fields(trl_config)}
    assert AsyncOptions().max_staleness == theirs["max_staleness"]
    assert AsyncOptions().weight_sync_steps == theirs["weight_sync_steps"]


@pytest.mark.parametrize("override, message", [
    ("grpo.asynchronous.max_staleness=-1", "grpo.asynchronous.max_staleness=-1: must be >= 0"),
    ("grpo.asynchronous.weight_sync_steps=0", "grpo.asynchronous.weight_sync_steps=0: must be >= 1"),
    ("grpo.asynchronous.rollout_devices=0", "grpo.asynchronous.rollout_devices=0: must be >= 1"),
    ("grpo.asynchronous.mode=eager", "grpo.asynchronous.mode='eager': must be 'deterministic' or 'free_running'"),
    ("grpo.asynchronous.lag=1", "unknown config key grpo.asynchronous.lag"),
])
def test_a_value_out_of_range_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigValueError) as err:
        load_config(GRPOConfig, None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_constructed_in_python_it_is_checked_too():
    with pytest.raises(ConfigValueError, match=r"grpo.asynchronous.max_staleness=-2: must be >= 0"):
        AsyncOptions(max_staleness=-2)


def test_device_groups_are_disjoint_and_leave_each_side_a_device():
    assert AsyncOptions(rollout_devices=4).device_groups(8) == (4, 4)
    assert AsyncOptions(rollout_devices=1).device_groups(8) == (1, 7)
    assert AsyncOptions().device_groups(8) == (4, 4) and AsyncOptions().device_groups(3) == (1, 2)
    for options, devices in ((AsyncOptions(rollout_devices=8), 8), (AsyncOptions(), 1)):
        with pytest.raises(ValueError, match="must leave at least one of the .* devices to train"):
            options.device_groups(devices)


def test_a_trainer_refuses_in_one_line_what_the_asynchronous_runner_does_not_run():
    from jaxcore.api import GRPOTrainer
    from jaxcore.grpo.async_config import async_refusal

    GRPOTrainer(args=load_config(GRPOConfig, None, ["grpo.asynchronous.max_staleness=1"]))     # what runs
    # across two processes with checkpoints and held-out evaluation (the defaults) too
    assert async_refusal(load_config(GRPOConfig, None, ["grpo.asynchronous.max_staleness=1",
                                                        "distributed.num_processes=2"])) is None
    assert async_refusal(load_config(GRPOConfig, None, ["grpo.asynchronous.max_staleness=1", "grpo.fsdp=2"])) is None
    for overrides, match in ((["distributed.num_processes=2", "grpo.fsdp=2"], "across processes with grpo.fsdp=2 "
                                                                              "is not built yet"),
                             (["distributed.num_processes=3"], "runs on two, one training and one generating, "
                                                               "not 3"),
                             (["distributed.num_processes=2", "grpo.asynchronous.mode=free_running"],
                              "deterministic schedule only"),
                             (["grpo.num_iterations=2"], "grpo.num_iterations=2 must be 1"),
                             (["grpo.beta=0.04"], "grpo.beta=0.04 is not part of TRL's asynchronous GRPO loss"),
                             (["grpo.loss_type=grpo"], "grpo.loss_type='grpo' is not part of"),
                             (["rollout.temperature=0.7"], "only temperature 1 runs so far")):
        cfg = load_config(GRPOConfig, None, ["grpo.asynchronous.max_staleness=1", *overrides])
        with pytest.raises(ConfigValueError, match=match) as err:
            GRPOTrainer(args=cfg)
        assert "\n" not in str(err.value)
    trainer = GRPOTrainer(args=GRPOConfig())
    trainer.args.grpo.asynchronous = AsyncOptions()       # set after construction: train() checks
    trainer.args.grpo.num_iterations = 2
    with pytest.raises(ConfigValueError, match="grpo.num_iterations=2 must be 1"):
        trainer.train()


def test_jaxcore_grpo_in_a_refused_layout_is_one_line_and_writes_nothing(capsys, tmp_path):
    from cli_runs import grpo_args, run_cli

    from jaxcore.grpo.async_config import async_refusal

    out = tmp_path / "run"
    overrides = ("grpo.asynchronous.max_staleness=1", "grpo.num_iterations=2")
    code, lines = run_cli(capsys, "grpo", *grpo_args(tmp_path / "no-model", out, *overrides))
    reason = async_refusal(load_config(GRPOConfig, None, list(overrides)))
    assert code == 2 and lines == [f"jaxcore grpo: error: {reason}"]
    assert not out.exists()


def test_fsdp_between_groups_of_other_sizes_is_refused_in_one_line(tiny_dir, capsys, tmp_path):
    """grpo.fsdp moves each shard to its counterpart rollout device, so both groups need the same size: 2 rollout and
    6 training devices stop before anything is written (before, a sharding's repr from deep in the sync)."""
    from cli_runs import grpo_args, run_cli

    out = tmp_path / "run"
    code, lines = run_cli(capsys, "grpo", *grpo_args(tiny_dir("llama"), out, "grpo.asynchronous.max_staleness=1",
                                                     "grpo.fsdp=2", "grpo.asynchronous.rollout_devices=2",
                                                     "rollout.prompts_per_epoch=6"))
    assert code == 2 and lines == ["jaxcore grpo: error: grpo.asynchronous with grpo.fsdp=2 moves the weights' shards "
                                   "between groups of the same size: 2 rollout and 6 training devices; set "
                                   "grpo.asynchronous.rollout_devices to half the devices"]
    assert not out.exists()
