"""EGGROLL's settings (the `es:` section, also the library's `EggrollConfig`) and the `jaxcore es` job
config composed of them and of the runtime's, rewards' and mesh sections."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

from annotated_types import Ge, Gt, MultipleOf

from jaxcore.config.schema import Checked
from jaxcore.es.shaping import SHAPERS
from jaxcore.parallel.config import DistributedConfig, MeshConfig
from jaxcore.rewards.config import RewardsConfig, TaskConfig
from jaxcore.runtime.config import ModelSource, RolloutConfig, TrainConfig
from jaxcore.runtime.optim import OptimizerConfig

Shaping = Literal[tuple(SHAPERS)]              # one entry per mode in jaxcore.es.shaping
MasterDtype = Literal["float32", "bfloat16"]
SHAPINGS = typing.get_args(Shaping)
MASTER_DTYPES = typing.get_args(MasterDtype)


# Hashed by value (a `NoisePlan` keeps a copy as static jit data); `make_plan` copies it, so changing a
# config afterwards never changes a plan made from it.
@dataclasses.dataclass(unsafe_hash=True)
class EggrollConfig(Checked):
    """Population and noise settings (the `es:` section; ranges checked on construction)."""

    population: Annotated[int, Ge(2), MultipleOf(2)] = 64   # N members, even (antithetic pairs)
    rank: Annotated[int, Ge(1)] = 1             # r
    sigma: Annotated[float, Gt(0)] = 0.01
    noise_reuse: Annotated[int, Ge(1)] = 1      # epochs that share one draw of noise
    seed: Annotated[int, Ge(0)] | None = None   # noise seed (None: train.seed in a job, 0 for a bare make_plan)
    shaping: Shaping = "zscore"
    non_matrix: Literal["frozen", "full"] = "frozen"   # full: full-rank Gaussian noise on norms and biases
    include_embeddings: bool = False
    include_lm_head: bool = False
    master_dtype: MasterDtype = "float32"       # the sharded master weights and optimizer state


def _greedy_rollout() -> RolloutConfig:
    return RolloutConfig(temperature=0.0)


@dataclasses.dataclass
class ESConfig:
    """`jaxcore es` configuration."""

    model: ModelSource = dataclasses.field(default_factory=ModelSource)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=_greedy_rollout)
    es: EggrollConfig = dataclasses.field(default_factory=EggrollConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    @property
    def total_steps(self) -> int:
        """Optimiser steps of the whole run: one update per epoch."""
        return self.train.epochs
