"""TRL 1.16's GRPO script surface on jaxcore: `GRPOConfig` with TRL's flat arguments (`config`, each argument's
handling in `arguments`) and `GRPOTrainer` with TRL's constructor and methods (`trainer`). A TRL script runs by
changing its import: `from jaxcore.trl import GRPOConfig, GRPOTrainer`. `ESConfig` and `ESTrainer` (`es`) give
EGGROLL the same arguments and surface. `AsyncGRPOConfig` and `AsyncGRPOTrainer` (`async_grpo`) take TRL's
`experimental.async_grpo` arguments (its runner is not built yet: the trainer says so in one line).

May import: `jaxcore.api` and the layers below it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer", "ESConfig", "ESTrainer", "GRPOConfig", "GRPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "GRPOConfig":
        from jaxcore.trl.config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from jaxcore.trl.trainer import GRPOTrainer

        return GRPOTrainer
    if name in ("ESConfig", "ESTrainer"):
        from jaxcore.trl import es

        return getattr(es, name)
    if name in ("AsyncGRPOConfig", "AsyncGRPOTrainer"):
        from jaxcore.trl import async_grpo

        return getattr(async_grpo, name)
    raise AttributeError(f"module 'jaxcore.trl' has no attribute {name!r}")
