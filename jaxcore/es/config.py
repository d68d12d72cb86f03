"""EGGROLL's settings (the `es:` section, also the library's `EggrollConfig`) and the `jaxcore es` job
config composed of them and of the runtime's, rewards' and mesh sections."""

from __future__ import annotations

import dataclasses

from jaxcore.parallel.config import DistributedConfig, MeshConfig
from jaxcore.rewards.config import RewardsConfig, TaskConfig
from jaxcore.runtime.config import ModelSource, RolloutConfig, TrainConfig
from jaxcore.runtime.optim import OptimizerConfig

SHAPINGS = ("zscore", "group_zscore", "centered_rank", "none")
MASTER_DTYPES = ("float32", "bfloat16")


# Hashed by value (a `NoisePlan` keeps a copy as static jit data); `make_plan` copies it, so changing a
# config afterwards never changes a plan made from it.
@dataclasses.dataclass(unsafe_hash=True)
class EggrollConfig:
    """Population and noise settings (the `es:` section)."""

    population: int = 64            # N members, even (antithetic pairs)
    rank: int = 1                   # r
    sigma: float = 0.01
    noise_reuse: int = 1            # epochs that share one draw of noise
    seed: int | None = None         # noise seed (None: train.seed in a job, 0 for a bare make_plan)
    shaping: str = "zscore"         # zscore | group_zscore | centered_rank | none
    non_matrix: str = "frozen"      # "frozen" | "full" (full-rank Gaussian noise on norms and biases)
    include_embeddings: bool = False
    include_lm_head: bool = False
    master_dtype: str = "float32"   # float32 | bfloat16: the sharded master weights and optimizer state

    def __post_init__(self) -> None:
        if self.population < 2 or self.population % 2:
            raise ValueError(f"population must be an even number >= 2, got {self.population}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if self.noise_reuse < 1:
            raise ValueError(f"noise_reuse must be >= 1, got {self.noise_reuse}")
        if self.non_matrix not in ("frozen", "full"):
            raise ValueError(f"non_matrix must be 'frozen' or 'full', got {self.non_matrix!r}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if self.shaping not in SHAPINGS:
            raise ValueError(f"shaping must be one of {', '.join(SHAPINGS)}, got {self.shaping!r}")
        if self.master_dtype not in MASTER_DTYPES:
            raise ValueError(f"master_dtype={self.master_dtype!r}: choose {' or '.join(MASTER_DTYPES)}")


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
