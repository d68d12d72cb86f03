"""Asynchronous GRPO over two processes (issue 53): the multi-process start-up (`distributed:`) with the training
devices on one process and the rollout devices on the other, on the deterministic schedule.

Both processes run the `Runner` and this algorithm, in step: the same epochs, the same collectives in the same order.

- The generating process holds the rollout worker (`RolloutWorker`) and the weight versions on its devices; its
  learner holds the initial weights on its own devices and never trains.
- Each epoch, the generating process hands its batch over (`hand_over`: tokens, log-probs, lengths through the host:
  a few integers per row). The training process scores it and trains on it, as the one-process runner does; the
  generating process takes part in the scoring's gathers with no rows of its own, so every row is scored once.
- Every `weight_sync_steps` steps both run the sync program (`ProcessSync`): each weight moves once, device to device,
  by a collective-permute, counted in the compiled program.
- The step's result (metrics, skipped or not) goes to both (`share`), so the two runners log, skip and stop alike.

The run therefore equals the one-process asynchronous run on the same devices (4 + 4) under the same collectives
(gloo sums the training devices' partial sums in its own order) bit for bit. Not built yet, each refused in one line
(`async_refusal`): more processes, free-running mode, checkpoints (and so resuming) and held-out evaluation.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from jaxcore.grpo.algorithm import advantage_rewards
from jaxcore.grpo.async_algorithm import AsyncGRPOAlgorithm, device_groups
from jaxcore.grpo.async_transfer import ProcessSync, hand_over, share
from jaxcore.grpo.config import GRPOConfig
from jaxcore.inference.generate import GenerationResult
from jaxcore.parallel import meshes
from jaxcore.rewards import Example, Scorer
from jaxcore.runtime.algorithm import StepResult
from jaxcore.runtime.programs import PhaseClock
from jaxcore.runtime.rollout import Rollout, RolloutOutput


def process_roles(train_devices: list[Any], rollout_devices: list[Any]) -> tuple[int, int]:
    """(the training process, the generating process): each group must lie on one process, the two on two; else one
    line."""
    trainers = sorted({d.process_index for d in train_devices})
    generators = sorted({d.process_index for d in rollout_devices})
    if len(trainers) != 1 or len(generators) != 1 or trainers == generators:
        raise ValueError(f"grpo.asynchronous across processes trains on one process and generates on the other: the "
                         f"training devices are on processes {trainers} and the rollout devices on {generators}; set "
                         f"grpo.asynchronous.rollout_devices to the generating process's {jax.local_device_count()} "
                         "devices")
    return trainers[0], generators[0]


def _plain(value: Any) -> Any:
    """A metric as JSON holds it (numpy scalars as Python numbers)."""
    return value.item() if isinstance(value, np.generic) else value


class AsyncGRPOAcrossProcesses(AsyncGRPOAlgorithm):
    """Asynchronous GRPO with the training devices on one process and the rollout devices on the other."""

    def __init__(self, model: Any, tokenizer: Any, cfg: GRPOConfig, *, eos_token_ids: tuple[int, ...] = (),
                 rollout: Rollout | None = None):
        self.trainer, self.generator = process_roles(*device_groups(cfg))
        self.trains = jax.process_index() == self.trainer
        super().__init__(model, tokenizer, cfg, eos_token_ids=eos_token_ids, rollout=rollout)
        self.train_rows = meshes.leading_axis(meshes.grpo_mesh(1, device_groups(cfg)[0]), self.learner.batch_axes)

    def training_devices(self) -> list[Any] | None:
        """The training devices on the training process; on the generating process its own devices (its learner
        only holds the initial weights there: the buffers the weight syncs arrive in)."""
        train, rollout = device_groups(self.cfg)
        return train if self.trains else rollout

    def _weight_sync(self) -> ProcessSync:
        return ProcessSync(*device_groups(self.cfg), self.rollout_mesh)

    def prepare(self, upcoming: list[list[Example]]) -> None:
        if self.trains:                  # the generating process makes no train-step programs
            super().prepare(upcoming)

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The handed-over batch's arrays: their shapes and dtypes."""
        r = self.cfg.rollout
        rows = r.prompts_per_epoch * r.generations_per_prompt
        return {"tokens": ((rows, r.max_new_tokens), np.int32), "logprobs": ((rows, r.max_new_tokens), np.float32),
                "lengths": ((rows,), np.int32), "finished": ((rows,), np.int32), "rollout_wait_s": ((1,), np.float64)}

    def _batch_of(self, epoch: int, examples: list[Example]) -> dict[str, np.ndarray] | None:
        """On the generating process: batch `epoch` from the worker (waited for) as host arrays; None elsewhere."""
        if self.trains:
            return None
        if self.worker is None:
            self._start()
        self._submit(examples)
        out = {**self._host(self.worker.result(epoch).result),
               "rollout_wait_s": np.array([self.worker.waited_for_weights()])}
        self.worker.forget(epoch)
        self._generated.pop(epoch, None)      # its timeline is not handed over: logged in one process only
        return {k: np.asarray(v, dtype) for k, v in out.items() for dtype in [self._shapes()[k][1]]}

    def _output(self, examples: list[Example], batch: dict[str, np.ndarray]) -> RolloutOutput:
        """The handed-over batch as the rollout would give it, its rows over the training devices (on the generating
        process an array with none of them here: it scores no row)."""
        g = self.cfg.rollout.generations_per_prompt
        ids, mask, truncated = self.rollout.encode(examples, self.model_config, warn=self.trains)

        def place(x: np.ndarray) -> jax.Array:
            return jax.make_array_from_callback(x.shape, self.train_rows, lambda index: x[index], dtype=x.dtype)

        result = GenerationResult(place(batch["tokens"]), place(batch["logprobs"]), place(batch["lengths"]),
                                  place(batch["finished"].astype(bool)))
        return RolloutOutput([e for e in examples for _ in range(g)], np.repeat(ids, g, 0), np.repeat(mask, g, 0),
                             result, prompts_truncated=truncated)

    def train_step(self, epoch: int, examples: list[Example], scorer: Scorer) -> StepResult:
        if epoch != self.finished:
            raise RuntimeError(f"asynchronous GRPO trains batch {self.finished} next, not {epoch}")
        clock, began = PhaseClock(), time.perf_counter()
        batch = hand_over(self._batch_of(epoch, examples), self._shapes())
        waited = time.perf_counter() - began
        out = self._output(examples, batch)
        if self.trains:
            result = self.train_on(out, scorer, clock, began, rollout_logprobs=not self._on_policy(epoch))
        else:                            # the scoring's gathers, with no row of this process's
            self.rollout.score(out, scorer, combined=lambda s: advantage_rewards(s, scorer.fallback))
        self.next_batch = self.finished = epoch + 1
        sync_seconds = self._sync()
        if self.worker is not None:
            self._submit()                      # the new version's batches start while the runner logs
        if not self.trains:
            step = share(None, self.trainer)
            return StepResult(step["metrics"], skipped=step["skipped"], reason=step["reason"])
        result.metrics.update({**self._async_metrics(epoch, self.schedule.generation_version(epoch), waited,
                                                     float(batch["rollout_wait_s"][0]), sync_seconds),
                               "async/weight_permutes": self.sync.permutes()})
        share({"metrics": {k: _plain(v) for k, v in result.metrics.items()}, "skipped": result.skipped,
               "reason": result.reason}, self.trainer)
        return result
