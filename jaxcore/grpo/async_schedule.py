"""Asynchronous GRPO's deterministic schedule (`grpo.asynchronous.mode: deterministic`): which weights generate
each batch, what the rollout devices may generate while the trainer trains, and what a checkpoint keeps so that a
resumed run equals a straight one. Pure integer arithmetic: no JAX, no timing.

Optimizer step k trains batch k. A weight version v is the policy after v x S optimizer steps (S:
`weight_sync_steps`); version 0 is the initial policy, and version v reaches the rollout devices once step v x S - 1
has finished (one sync every S steps, TRL's counting: its `model_version`). With L = `max_staleness`, batch k is
generated from version

    g(k) = max(0, k // S - L)

so the trainer, at version k // S when it trains batch k, is min(k // S, L) <= L versions ahead of it: TRL's
staleness, fixed by k rather than by timing. The rollout devices hold one version at a time and generate its
batches (`batches_of`) in order; version v replaces v - 1 there once v - 1's batches are generated (the trainer,
which trains batches generated L versions back, does not wait for that). With L >= 1 the rollout devices always
have a batch to generate while a step trains (the overlap); with L = 0 and S = 1 batch k is generated from the
weights after step k - 1: the synchronous run. Batch k's prompts and sampling key are fixed by k (the k-th batch of
the data order, `jax.random.fold_in(key, k)`), so its tokens depend only on g(k)'s weights.

TRL's free-running mode (`mode: free_running`) generates as fast as the rollout can and drops samples staler than
L when they reach the trainer (`fresh`); staleness then depends on timing and a run is not reproducible.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The deterministic schedule of `max_staleness` L and `weight_sync_steps` S (`AsyncOptions`' settings)."""

    max_staleness: int
    weight_sync_steps: int = 1

    def __post_init__(self) -> None:
        if self.max_staleness < 0 or self.weight_sync_steps < 1:
            raise ValueError(f"a schedule needs max_staleness >= 0 and weight_sync_steps >= 1, not "
                             f"{self.max_staleness} and {self.weight_sync_steps}")

    def trainer_version(self, step: int) -> int:
        """The version the trainer has published when it trains step `step` (after `step` finished steps)."""
        return step // self.weight_sync_steps

    def generation_version(self, batch: int) -> int:
        """g(k): the weight version batch `batch` is generated from."""
        return max(0, batch // self.weight_sync_steps - self.max_staleness)

    def staleness(self, batch: int) -> int:
        """Versions between the weights batch `batch` was generated with and the trainer's when it trains it."""
        return self.trainer_version(batch) - self.generation_version(batch)

    def on_policy(self, batch: int) -> bool:
        """Whether batch `batch` is generated from the very weights its step trains (its version published right
        before that step): its ratio is then 1, not the sampler's log-probs against the training forward's
        (`jaxcore.grpo.async_loss`: sampler log-probs None), and with lag 0 and a sync every step every batch is."""
        return self.published_after(self.generation_version(batch)) == batch

    def published_after(self, version: int) -> int:
        """The finished optimizer steps after which `version` is on the rollout devices (its weights: the policy
        after that many steps)."""
        return version * self.weight_sync_steps

    def batches_of(self, version: int) -> range:
        """The batches generated from `version`, in order (version 0 also has the first L x S batches)."""
        s, lag = self.weight_sync_steps, self.max_staleness
        start = 0 if version == 0 else (version + lag) * s
        return range(start, (version + lag + 1) * s)

    def generatable(self, finished_steps: int) -> range:
        """The batches not yet trained whose version is published once `finished_steps` steps have finished: what
        the rollout devices may hold or generate while step `finished_steps` trains."""
        return range(finished_steps, self.batches_of(self.trainer_version(finished_steps)).stop)

    def checkpoint_plan(self, finished_steps: int) -> CheckpointPlan:
        """What a checkpoint after `finished_steps` steps keeps besides the train state: the rollout devices hold
        only the newest version, so every untrained batch of an older version was generated before that version
        arrived and is stored as generated (tokens, sampler log-probs, rewards); the newest version's batches are
        regenerated on resume from its weights, which are the trained weights at a sync boundary and are stored
        beside them otherwise."""
        version = self.trainer_version(finished_steps)
        pending = self.generatable(finished_steps)
        stored = tuple(k for k in pending if self.generation_version(k) < version)
        regenerated = tuple(k for k in pending if self.generation_version(k) == version)
        return CheckpointPlan(finished_steps, version, stored, regenerated,
                              rollout_weights=finished_steps % self.weight_sync_steps != 0)


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
    """`Schedule.checkpoint_plan`'s answer: the batches stored as generated, those regenerated on resume from
    `version`'s weights, and whether those weights are stored beside the train state (`rollout_weights`: the
    checkpoint is not at a sync boundary, so the trained weights are ahead of the rollout's)."""

    finished_steps: int
    version: int
    stored: tuple[int, ...]
    regenerated: tuple[int, ...]
    rollout_weights: bool


def fresh(trainer_version: int, sample_versions: np.ndarray, max_staleness: int) -> tuple[np.ndarray, int]:
    """Free-running mode, TRL's `RolloutQueueDataset`: (the samples whose staleness is at most `max_staleness`,
    how many were dropped: TRL's `sample/dropped_stale_total`)."""
    keep = trainer_version - np.asarray(sample_versions) <= max_staleness
    return keep, int((~keep).sum())
