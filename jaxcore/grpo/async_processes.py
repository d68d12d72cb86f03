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
- A checkpoint holds the one-process run's state, every array on the host (`checkpoint_state`): orbax writes host
  arrays from its primary process, the training process, which gets the stored batches and (off a sync boundary)
  the newest version's weights from the generating process through the host. On resume the training process takes
  the train state, the generating process the newest version's weights and the stored batches.
- Held-out evaluation generates on the training devices, as in one process; the generating process takes part in
  the scoring's gathers with no rows, and both log the training process's metrics.

The run therefore equals the one-process asynchronous run on the same devices (4 + 4) under the same collectives
(gloo sums the training devices' partial sums in its own order) bit for bit, and a stopped and resumed run the
straight one. Not built yet, each refused in one line (`async_refusal`): more processes and free-running mode.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from jaxcore.grpo.algorithm import GRPOAlgorithm, advantage_rewards
from jaxcore.grpo.async_algorithm import AsyncGRPOAlgorithm, device_groups
from jaxcore.grpo.async_schedule import CheckpointPlan
from jaxcore.grpo.async_transfer import ProcessSync, hand_over, share
from jaxcore.grpo.config import GRPOConfig
from jaxcore.inference.generate import GenerationResult
from jaxcore.parallel import meshes
from jaxcore.rewards import Example, Scorer
from jaxcore.runtime.algorithm import StepResult
from jaxcore.runtime.evaluation import eval_batches
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

    syncs_in_background = False          # the sync is a collective, in line (`_publish`)

    def __init__(self, model: Any, tokenizer: Any, cfg: GRPOConfig, *, eos_token_ids: tuple[int, ...] = (),
                 rollout: Rollout | None = None):
        self.trainer, self.generator = process_roles(*device_groups(cfg))
        self.trains = jax.process_index() == self.trainer
        super().__init__(model, tokenizer, cfg, eos_token_ids=eos_token_ids, rollout=rollout)
        train_mesh = meshes.grpo_mesh(1, device_groups(cfg)[0])
        self.train_rows = meshes.leading_axis(train_mesh, self.learner.batch_axes)
        self.eval_sharding = meshes.replicated(train_mesh)      # evaluation generates on the training devices

    def training_devices(self) -> list[Any] | None:
        """The training devices on the training process; on the generating process its own devices (its learner
        only holds the initial weights there: the buffers the weight syncs arrive in)."""
        train, rollout = device_groups(self.cfg)
        return train if self.trains else rollout

    def _weight_sync(self) -> ProcessSync:
        return ProcessSync(*device_groups(self.cfg), self.rollout_mesh)

    def _publish(self, version: int, params: Any) -> None:
        """The sync in line: a collective of both processes, run where both call it (never on a thread)."""
        self.newest = (version, self.sync.push(params))
        if self.worker is not None:           # the training process has none
            self.worker.publish(*self.newest)

    def prepare(self, upcoming: list[list[Example]]) -> None:
        if self.trains:                  # the generating process makes no train-step programs
            super().prepare(upcoming)

    def _shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        """The handed-over batch's arrays: their shapes and dtypes."""
        r = self.cfg.rollout
        rows, width = r.prompts_per_epoch * r.generations_per_prompt, r.max_new_tokens
        return {"tokens": jax.ShapeDtypeStruct((rows, width), np.int32),
                "logprobs": jax.ShapeDtypeStruct((rows, width), np.float32),
                "lengths": jax.ShapeDtypeStruct((rows,), np.int32), "finished": jax.ShapeDtypeStruct((rows,), np.int32),
                "rollout_wait_s": jax.ShapeDtypeStruct((1,), np.float64)}

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
        return {k: np.asarray(v, self._shapes()[k].dtype) for k, v in out.items()}

    def _output(self, examples: list[Example], batch: dict[str, np.ndarray]) -> RolloutOutput:
        """The handed-over batch as the rollout would give it, its rows over the training devices (on the generating
        process an array with none of them here: it scores no row)."""
        g = self.cfg.rollout.generations_per_prompt
        ids, mask, truncated = self.rollout.encode(examples, self.model_config, warn=self.trains)
        result = GenerationResult(*(_laid(self.train_rows, x) for x in (
            batch["tokens"], batch["logprobs"], batch["lengths"], batch["finished"].astype(bool))))
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

    # -- held-out evaluation ---------------------------------------------------------------------------------

    def evaluate(self, examples: list[Example], scorer: Scorer, *, batch_size: int, samples_per_prompt: int = 0
                 ) -> dict[str, Any]:
        """The training process evaluates its policy on its devices, as the one-process run does; the generating
        process takes part in each batch's scoring with no row of its own; both get the training process's
        metrics (`share`)."""
        if self.trains:
            metrics = super().evaluate(examples, scorer, batch_size=batch_size, samples_per_prompt=samples_per_prompt)
        else:
            for count, rows, _ in eval_batches(examples, batch_size, self.eval_sharding, samples_per_prompt):
                self.rollout.score(self._no_rows(rows), scorer, padding_from=count)
            metrics = None
        return share(metrics, self.trainer)

    def _no_rows(self, rows: list[Example]) -> RolloutOutput:
        """An evaluation batch's rollout as the generating process takes part in its scoring: arrays on the training
        devices, none of them here."""
        n, width = len(rows), self.cfg.rollout.max_new_tokens
        result = GenerationResult(*(_laid(self.eval_sharding, np.zeros(shape, dtype)) for shape, dtype in
                                    (((n, width), np.int32), ((n, width), np.float32), ((n,), np.int32),
                                     ((n,), bool))))
        return RolloutOutput(rows, np.zeros((n, 0), np.int32), np.zeros((n, 0), np.int32), result)

    # -- checkpoints -----------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """The one-process run's checkpoint state, every array on the host: orbax writes host arrays from its
        primary process alone, the training process (process 0: its devices come first), which holds the train
        state and gets from the generating process the stored batches and (off a sync boundary) the newest
        version's weights through the host; the generating process gives zeros of the same shapes for what it
        does not hold."""
        state = super().checkpoint_state()
        return {k: v if k == "async" else self._host_copy(v) for k, v in state.items()}

    def _host_copy(self, tree: Any) -> Any:
        """The training process's arrays of `tree` on the host; zeros of their shapes on the generating process."""
        return jax.device_get(tree) if self.trains else jax.tree.map(lambda x: np.zeros(np.shape(x), x.dtype), tree)

    def _stored_batches(self, plan: CheckpointPlan) -> dict[str, np.ndarray]:
        """The stored batches (the generating process's worker holds them) on every process, through the host."""
        if self.trains:
            return hand_over(None, super()._stored_batches(dataclasses.replace(plan, stored=())))
        return hand_over(super()._stored_batches(plan), None)

    def _rollout_params(self, plan: CheckpointPlan) -> Any:
        """The newest version's weights per layer, on the host: at a sync boundary the trained weights (the training
        process's), else the generating process's copy, through the host."""
        trained = self.learner.to_layer_layout(self.learner.state.params)    # on the generating process: the shapes
        if not plan.rollout_weights:
            return self._host_copy(trained)
        return hand_over(None if self.trains else jax.device_get(super()._rollout_params(plan)), trained)

    def restore_state(self, state: dict[str, Any]) -> None:
        """A checkpoint's host arrays: the train state onto the training devices (the generating process's learner
        keeps the initial weights: it never trains), the newest version's weights onto the rollout devices and the
        stored batches into the generating process's worker."""
        if not self.trains:
            self.num_tokens = int(state["num_tokens"])
            self._restore_async(state["async"])
            return
        live = GRPOAlgorithm.checkpoint_state(self)
        super().restore_state({k: v if k == "async" else jax.tree.map(_placed_like, v, live[k])
                               for k, v in state.items()})
        self._stored = {}                     # the generating process's worker takes them

    def _restore_async(self, a: dict[str, Any]) -> None:
        super()._restore_async(a)
        if self.sync.syncs:                   # compiled where the straight run compiled it: at its first sync
            self.sync.prepare(self.learner.state.params)

    def _placed_rollout(self, layer_params: Any) -> Any:
        """The newest version's weights on the generating process's rollout devices (placed as its learner's
        copy, which is there); None on the training process."""
        if self.trains:
            return None
        live = self.learner.to_layer_layout(self.learner.state.params)
        return super()._placed_rollout(jax.tree.map(_placed_like, layer_params, live))


def _laid(sharding: Any, x: np.ndarray) -> jax.Array:
    """`x` laid over `sharding`: this process's shards of it (none where the devices are another process's)."""
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index], dtype=x.dtype)


def _placed_like(restored: Any, live: Any) -> Any:
    """A restored host array placed as the live array it replaces (a host value stays on the host)."""
    return jax.device_put(restored, live.sharding) if isinstance(live, jax.Array) else restored
