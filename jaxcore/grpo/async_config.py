"""The job's `grpo.asynchronous:` section: generation on its own devices from a copy of the weights, overlapping
training, with TRL 1.16 AsyncGRPO's `max_staleness` and `weight_sync_steps` (issue 53). The YAML key is
`asynchronous` because `async` is a Python keyword and every config key is its field's name.

In one process, `jaxcore.grpo.async_algorithm` runs the deterministic schedule (`jaxcore.grpo.async_schedule`) with
TRL's loss (`jaxcore.grpo.async_loss`): generation on `rollout_devices` from a copy of the weights, training on the
others, the weights synced device to device, in either mode. Over two processes (`jaxcore.grpo.async_processes`)
one process trains and the other generates, on the deterministic schedule, with checkpoints, resuming and held-out
evaluation as in one process; in one process the training group may shard the weights (`grpo.fsdp`). What they do
not run yet is refused in one line (`async_refusal`): more processes, or across processes free-running or FSDP;
LoRA, multi-turn rollouts, and the loss options TRL's asynchronous loss has not.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from annotated_types import Ge

from jaxcore.config.schema import check

ScheduleMode = Literal["deterministic", "free_running"]
SCHEDULE_MODES = typing.get_args(ScheduleMode)

# the loss settings TRL's asynchronous loss has no counterpart of, at the values that leave them off
_LOSS_OFF = (("loss_type", "dapo"), ("importance_sampling_level", "token"), ("delta", None),
             ("top_entropy_quantile", 1.0), ("entropy_coef", 0.0), ("use_adaptive_entropy", False),
             ("off_policy_mask_threshold", None), ("beta", 0.0))


def async_refusal(cfg: Any, processes: int = 1) -> str | None:
    """Why a `jaxcore grpo` job config with `grpo.asynchronous` set cannot run (one line), else None: what the
    runners (`jaxcore.grpo.async_algorithm`, `jaxcore.grpo.async_processes`) do not do yet, or what TRL's
    asynchronous GRPO has not (`processes`: the run's processes, besides `distributed.num_processes`)."""
    a, g = cfg.grpo.asynchronous, cfg.grpo
    if a is None:
        return None
    if across_processes(cfg, processes):
        reason = across_processes_refusal(cfg, max(processes, cfg.distributed.num_processes))
        if reason:
            return reason
    if g.lora is not None:
        return "grpo.asynchronous with grpo.lora is not built yet (issue 53)"
    if g.num_iterations != 1 or g.steps_per_rollout != 1:
        return (f"grpo.asynchronous trains each generated batch once, in one optimizer step (TRL's AsyncGRPO): "
                f"grpo.num_iterations={g.num_iterations} must be 1 and grpo.steps_per_generation="
                f"{g.generation_steps} equal to gradient_accumulation_steps={g.gradient_accumulation_steps}")
    for key, off in _LOSS_OFF:
        if getattr(g, key) != off:
            return (f"grpo.{key}={getattr(g, key)!r} is not part of TRL's asynchronous GRPO loss (clipped ratio "
                    f"against the sampler's log-probs): leave it at {off!r} with grpo.asynchronous")
    if cfg.rollout.temperature != 1.0:
        return (f"grpo.asynchronous with rollout.temperature={cfg.rollout.temperature}: the sampler's log-probs "
                "are the raw logits', the loss's the tempered ones; only temperature 1 runs so far")
    if cfg.rollout.multi_turn:
        return "grpo.asynchronous with multi-turn rollouts (tools, environments) is not built yet (issue 53)"
    return None


def across_processes(cfg: Any, processes: int = 1) -> bool:
    """Whether the run is a multi-process one (`distributed:`, or `processes` > 1): then one process trains and the
    other generates (`jaxcore.grpo.async_processes`)."""
    return max(processes, cfg.distributed.num_processes) > 1 or bool(cfg.distributed.coordinator)


def across_processes_refusal(cfg: Any, processes: int) -> str | None:
    """Why the two-process layout cannot run this job (one line), else None: it runs two processes and the
    deterministic schedule (checkpoints, resuming and held-out evaluation as in one process)."""
    if processes != 2:
        return (f"grpo.asynchronous across processes runs on two, one training and one generating, not "
                f"{processes} (distributed.num_processes)")
    if cfg.grpo.asynchronous.mode != "deterministic":
        return ("grpo.asynchronous across processes runs the deterministic schedule only: mode "
                f"{cfg.grpo.asynchronous.mode} is not built there yet (issue 53)")
    if cfg.grpo.fsdp > 1:
        return (f"grpo.asynchronous across processes with grpo.fsdp={cfg.grpo.fsdp} is not built yet (issue 53): "
                "the weights move between the processes replicated; set grpo.fsdp=1 or run in one process")
    return None


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
