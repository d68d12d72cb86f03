"""Fixtures shared by the GRPO tests (test_grpo_step, test_grpo_lora, test_grpo_options).

The process-wide setup (simulated devices, offline HF, `tiny_dir`) is in the repository's root conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def path(tiny_dir) -> Path:
    """The tiny llama checkpoint the GRPO tests train."""
    return tiny_dir("llama")


@pytest.fixture(scope="module")
def batch_rows() -> int:
    """Rows of `batch`; a test module overrides this fixture for another size."""
    return 8


@pytest.fixture(scope="module")
def batch(path: Path, batch_rows: int) -> Any:
    """Synthetic GRPO rollouts for `path`'s vocabulary: `batch_rows` rows of 6 prompt and 8 completion
    tokens in groups of 4 (seed 1)."""
    import jaxcore
    from jaxcore.bench.grpo import synthetic_batch

    vocab = jaxcore.load_hf(path).config.vocab_size
    return synthetic_batch(vocab, batch_rows, 6, 8, group_size=4, seed=1)


def make_grpo_job(**flat: Any) -> Any:
    """A `GRPOConfig` from flat settings (the names the GRPO tests once gave one flat config), each routed to
    the section that declares it (grpo, optimizer, rollout or train), with the aliases lr_schedule ->
    optimizer.schedule, max_completion_length -> rollout.max_new_tokens and total_steps -> train.epochs
    (total_steps / (num_iterations * steps_per_rollout) epochs; default 1000 optimiser steps, the horizon
    the tests' numbers were taken with). Validated like the trainer's (ValueError). The model's compute
    dtype and remat are the learner's keyword arguments, not settings here."""
    import dataclasses

    from jaxcore.grpo.config import GRPOConfig

    aliases = {"lr_schedule": ("optimizer", "schedule"), "max_completion_length": ("rollout", "max_new_tokens")}
    total_steps = flat.pop("total_steps", None)
    default = GRPOConfig()
    changes: dict[str, dict[str, Any]] = {"grpo": {}, "optimizer": {}, "rollout": {}, "train": {}}
    for name, value in flat.items():
        if name in aliases:
            section, field = aliases[name]
        else:
            owners = [s for s in changes if name in {f.name for f in dataclasses.fields(getattr(default, s))}]
            if len(owners) != 1:
                raise TypeError(f"grpo_job: {name!r} is declared by {owners or 'no section'} "
                                f"(compute_dtype and remat are GRPOLearner's keyword arguments)")
            section, field = owners[0], name
        changes[section][field] = value
    cfg = GRPOConfig(**{s: dataclasses.replace(getattr(default, s), **c) for s, c in changes.items()})
    if "epochs" not in changes["train"]:
        per_epoch = cfg.grpo.num_iterations * cfg.grpo.steps_per_rollout
        total_steps = 1000 if total_steps is None else total_steps
        assert total_steps % per_epoch == 0, f"total_steps={total_steps} is no whole number of epochs"
        cfg.train.epochs = total_steps // per_epoch
    else:
        assert total_steps is None, "give total_steps or train's epochs, not both"
    cfg.validate()
    return cfg


@pytest.fixture(scope="session")
def grpo_job() -> Any:
    """`make_grpo_job`: grpo_job(loss_type="dapo", learning_rate=1e-2, max_completion_length=8) -> GRPOConfig."""
    return make_grpo_job
