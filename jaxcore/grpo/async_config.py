"""The job's `grpo.asynchronous:` section: generation on its own devices from a copy of the weights, overlapping
training, with TRL 1.16 AsyncGRPO's `max_staleness` and `weight_sync_steps` (issue 53). The YAML key is
`asynchronous` because `async` is a Python keyword and every config key is its field's name.

What is built: these settings, the loss (`jaxcore.grpo.async_loss`) and the deterministic schedule
(`jaxcore.grpo.async_schedule`). What is not: the runner that generates on one device group while the other
trains, and the weight transfer between them; a run with this section set says so in one line (`RUNNER_MISSING`)
rather than training synchronously under an asynchronous name.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

from annotated_types import Ge

from jaxcore.config.schema import check

ScheduleMode = Literal["deterministic", "free_running"]
SCHEDULE_MODES = typing.get_args(ScheduleMode)

RUNNER_MISSING = ("grpo.asynchronous is set, but jaxcore cannot run asynchronous GRPO yet: the loss, the schedule "
                  "and the settings are built, the runner that generates on rollout_devices while the other devices "
                  "train is not (issue 53); remove grpo.asynchronous to train synchronously")


@dataclasses.dataclass
class AsyncOptions:
    """Asynchronous GRPO's settings, with TRL 1.16 AsyncGRPOConfig's names and meanings where TRL has them.

    `rollout_devices`: the devices that generate (None: half of them, at least one); the others train.
    `max_staleness`: how many weight versions a sample may lag the trainer's (a version is one weight sync).
    `weight_sync_steps`: optimizer steps between weight syncs to the rollout devices.
    `mode`: `deterministic` generates batch k from a version fixed by k (`jaxcore.grpo.async_schedule`), so a run is
    reproducible and a resumed run equals a straight one; `free_running` is TRL's: the rollout generates as fast as
    it can, a sample's staleness depends on timing, and samples staler than max_staleness are dropped.
    """

    rollout_devices: Annotated[int, Ge(1)] | None = None
    max_staleness: Annotated[int, Ge(0)] = 4
    weight_sync_steps: Annotated[int, Ge(1)] = 1
    mode: ScheduleMode = "deterministic"

    def __post_init__(self) -> None:
        check(self, "grpo.asynchronous.")

    def device_groups(self, devices: int) -> tuple[int, int]:
        """(generating devices, training devices) out of `devices`; one line when no device would be left to
        either group."""
        rollout = max(devices // 2, 1) if self.rollout_devices is None else self.rollout_devices
        if devices < 2 or rollout >= devices:
            raise ValueError(f"grpo.asynchronous.rollout_devices={rollout}: must leave at least one of the {devices} "
                             "devices to train (generation and training run on disjoint device groups)")
        return rollout, devices - rollout
