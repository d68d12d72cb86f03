"""Asynchronous GRPO in one process (`grpo.asynchronous`, issue 53): generation on the `rollout_devices` group from a
copy of the weights, on a thread of its own (`RolloutWorker`), while the other devices train; TRL 1.16 AsyncGRPO's
loss (`jaxcore.grpo.async_loss`, in the learner's step) on the sampler's log-probs.

The deterministic schedule (`jaxcore.grpo.async_schedule.Schedule`) fixes everything timing could change: batch k is
epoch k's prompts, sampled with epoch k's key, from weight version g(k) (one version per `weight_sync_steps`
epochs, `max_staleness` versions back at most), and epoch k trains it in one optimizer step. The run is therefore
reproducible, lag 0 with a sync every step is the synchronous run (`num_iterations` 1) bit for bit, and a
checkpoint keeps what `Schedule.checkpoint_plan` says (the batches generated from older versions as generated, the
newest version's weights), so a resumed run equals a straight one.

TRL's free-running mode (`mode: free_running`) lets each batch take the newest weights published when its generation
starts; a batch more than `max_staleness` versions behind the trainer when its turn comes is dropped
(`sample/dropped_stale_total`) and the next one taken, so batches follow the data order but epochs do not map to
batches, and a run is not reproducible (nor a resumed run the straight one: a checkpoint keeps the newest weights
and the data position, the batches in flight are generated again).

Scoring and advantages run on the main thread, in epoch order, as in the synchronous run: reward functions see the
same trainer state. Each step logs how long the trainer waited for its batch, how long the rollout waited for
weights, the weight sync's seconds and count, and TRL's `sample/staleness_mean` / `max`; and the timeline of the
step (seconds since the process started, as `run_time`): when its batch's generation began and ended, and when the
trainer's step on it (scoring, batch, update) began and ended, from which `jaxcore bench --suite async` measures
how much generation and training overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxcore.grpo.algorithm import GRPOAlgorithm
from jaxcore.grpo.async_config import async_refusal
from jaxcore.grpo.async_rollout import Job, RolloutWorker
from jaxcore.grpo.async_schedule import CheckpointPlan, Schedule
from jaxcore.grpo.async_weights import WeightSync
from jaxcore.grpo.config import GRPOConfig
from jaxcore.inference.generate import GenerationResult
from jaxcore.model import layer_stack
from jaxcore.parallel import meshes
from jaxcore.rewards import Example, Scorer
from jaxcore.runtime.algorithm import StepResult
from jaxcore.runtime.programs import PhaseClock, process_start_time
from jaxcore.runtime.rollout import Rollout, RolloutOutput

log = logging.getLogger(__name__)


def device_groups(cfg: GRPOConfig) -> tuple[list[Any], list[Any]]:
    """(training devices, rollout devices): the first devices train, the last `rollout_devices` generate."""
    rollout, train = cfg.grpo.asynchronous.device_groups(jax.device_count())
    devices = jax.devices()
    return devices[:train], devices[train:]


class AsyncGRPOAlgorithm(GRPOAlgorithm):
    """GRPO with generation and training on disjoint device groups, on the deterministic schedule."""

    syncs_in_background = True

    @classmethod
    def layout_refusal(cls, cfg: GRPOConfig, devices: int) -> str | None:
        reason = async_refusal(cfg, jax.process_count())
        if reason:
            return reason
        rollout, train = cfg.grpo.asynchronous.device_groups(devices)
        rows = cfg.rollout.prompts_per_epoch * cfg.rollout.generations_per_prompt
        if rows % rollout:
            return (f"prompts_per_epoch x generations_per_prompt = {rows} rows must be a multiple of the "
                    f"{rollout} rollout devices (grpo.asynchronous.rollout_devices)")
        if cfg.grpo.fsdp > 1 and rollout != train:     # shards move to counterpart devices (`rollout_sharding`)
            return (f"grpo.asynchronous with grpo.fsdp={cfg.grpo.fsdp} moves the weights' shards between groups of "
                    f"the same size: {rollout} rollout and {train} training devices; set "
                    "grpo.asynchronous.rollout_devices to half the devices")
        return super().layout_refusal(cfg, train)

    def __init__(self, model: Any, tokenizer: Any, cfg: GRPOConfig, *, eos_token_ids: tuple[int, ...] = (),
                 rollout: Rollout | None = None):
        reason = self.layout_refusal(cfg, jax.device_count())
        if reason:
            raise ValueError(reason)
        if rollout is not None and rollout.agent is not None:
            raise ValueError("grpo.asynchronous with tools, environments or a rollout_func is not built yet "
                             "(issue 53)")
        super().__init__(model, tokenizer, cfg, eos_token_ids=eos_token_ids, rollout=rollout)
        a = cfg.grpo.asynchronous
        self.schedule = Schedule(a.max_staleness, a.weight_sync_steps)
        self.rollout_mesh = meshes.grpo_mesh(1, device_groups(cfg)[1])
        self.rollout_rows = meshes.leading_axis(self.rollout_mesh, meshes.batch_axes_of(self.rollout_mesh))
        self.sync = self._weight_sync()
        self.rollout_rest = self.sync.place(self.learner.rest)        # non-trainable state (e.g. rope tables)
        self.newest = (0, self.sync.place(self.learner.state.params))   # the newest version on the rollout devices
        self._in_flight: tuple[int, Future] | None = None        # the version whose sync runs (`_publish`)
        self._sync_waited = 0.0        # seconds the trainer waited for a sync since the last step's metrics
        self.finished = 0              # epochs (= optimizer steps, skipped ones included) done
        self.free = a.mode == "free_running"
        self.next_batch = 0            # the next batch to train (deterministic: = finished; free-running: past drops)
        self.dropped = 0               # free-running: batches dropped as too stale (TRL's sample/dropped_stale_total)
        self.worker: RolloutWorker | None = None
        self._draw: Callable[[int], list[Example]] | None = None
        self._stored: dict[int, dict[str, np.ndarray]] = {}     # a checkpoint's generated batches, until resumed
        self._models: tuple[int, Any] = (-1, None)              # the rollout's model of one version (worker only)
        started = process_start_time()
        self._origin = time.perf_counter() - (0.0 if started is None else time.time() - started)
        self._generated: dict[int, tuple[float, float]] = {}    # batch -> its generation's (began, ended)

    @classmethod
    def training_devices_of(cls, cfg: GRPOConfig) -> list[Any] | None:
        return device_groups(cfg)[0]

    def _weight_sync(self) -> WeightSync:
        """What moves the weights to the rollout devices (in one process: `jax.device_put`)."""
        return WeightSync(self.rollout_mesh)

    def trains_on_rollout_logprobs(self) -> bool:
        a = self.cfg.grpo.asynchronous
        return a.max_staleness > 0 or a.weight_sync_steps > 1 or a.mode == "free_running"

    def _on_policy(self, batch: int) -> bool:
        """Whether batch `batch` is trained by the very weights it was generated from (then without the sampler's
        log-probs: ratio 1); never assumed in free-running mode."""
        return not self.free and self.schedule.on_policy(batch)

    def examples_ahead(self, draw: Callable[[int], list[Example]]) -> None:
        self._draw = draw

    def close(self) -> None:
        super().close()
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        in_flight, self._in_flight = self._in_flight, None
        self.sync.close()                  # after the sync still running, if any
        if in_flight is not None and in_flight[1].exception() is not None:     # nothing waits for it any more
            log.warning("the weight sync of version %d failed: %s", in_flight[0], in_flight[1].exception())

    # -- the rollout side ----------------------------------------------------------------------------------

    def _rollout_model(self, version: int, params: Any) -> Any:
        """The policy of `version` on the rollout devices, per layer (what decoding runs); built once per version."""
        if self._models[0] != version:
            self._models = (-1, None)          # the older version's arrays go first
            self._models = (version, layer_stack.unrolled(nnx.merge(self.learner.graphdef, params, self.rollout_rest)))
        return self._models[1]

    def _now(self) -> float:
        """The timeline's clock: seconds since the process started (monotonic)."""
        return time.perf_counter() - self._origin

    def _generate(self, params: Any, job: Job) -> RolloutOutput:
        """Batch `job.batch` on the rollout devices (the worker's thread): its examples with its epoch's key, from
        its version's weights; the sampler's log-probs unless the batch is on-policy (its ratio is then 1)."""
        k, examples = job.batch, job.work
        began = self._now()
        out = self.rollout.run(self._rollout_model(job.version, params), examples, key=self.rollout.epoch_key(k),
                               generations=self.cfg.rollout.generations_per_prompt, row_sharding=self.rollout_rows,
                               logprobs=not self._on_policy(k))
        self._generated[k] = (began, self._now())       # `run` returns the generation waited for
        return out

    def _examples_of(self, batch: int, given: list[Example] | None = None) -> list[Example]:
        if given is not None:
            return given
        if self._draw is None:
            raise RuntimeError(f"asynchronous GRPO needs batch {batch}'s examples ahead (Algorithm.examples_ahead)")
        return self._draw(batch)

    def _start(self) -> None:
        """The worker, with the newest version's weights and a checkpoint's generated batches."""
        self._settle()
        self.worker = RolloutWorker(self._generate)
        self.worker.publish(*self.newest)
        for k, stored in sorted(self._stored.items()):
            self.worker.put(k, self._restored_output(k, stored), self.schedule.generation_version(k))
        self._stored = {}

    def _submit(self, current: list[Example] | None = None) -> None:
        """Queue every batch the published weights can generate now (`Schedule.generatable`) and not yet queued,
        within the run's epochs; free-running, the (max_staleness + 1) x weight_sync_steps batches from the next one
        on, each to take the newest weights when it starts."""
        a = self.cfg.grpo.asynchronous
        if self.free:
            stop = self.next_batch + (a.max_staleness + 1) * a.weight_sync_steps
        else:
            stop = min(self.schedule.generatable(self.finished).stop, self.cfg.train.epochs)
        for k in range(self.next_batch, stop):
            if not self.worker.holds(k):
                work = self._examples_of(k, current if k == self.finished else None)
                self.worker.submit(Job(k, None if self.free else self.schedule.generation_version(k), work))

    def _sync(self) -> float:
        """After a finished step: a weight sync every `weight_sync_steps` steps (TRL's), also where no batch of this
        run needs the version (a checkpoint keeps it: a resumed run with more epochs generates from it); the newest
        finished sync's seconds (0 without a sync)."""
        f, s = self.finished, self.schedule.weight_sync_steps
        if f % s:
            return 0.0
        self._publish(f // s, self.learner.state.params)
        if self.free:        # a free-running batch takes the newest weights when it starts: those of this sync
            self._settle()
        return self.sync.seconds

    def _publish(self, version: int, params: Any) -> None:
        """Start the sync of `version`'s weights on the sync thread, which publishes them to the worker once they
        are on the rollout devices; the trainer goes on meanwhile (its steps leave `params` intact). One sync at a
        time: the one before is waited for first (long done, unless syncs take longer than steps)."""
        self._settle()
        worker = self.worker                # started with the first step, before any sync
        future = self.sync.start(params, lambda copied: worker.publish(version, copied))
        future.add_done_callback(lambda done: _fail_on_error(worker, done))   # raised where the trainer waits
        self._in_flight = (version, future)

    def _settle(self) -> None:
        """Wait for the sync in flight: `newest` is then the newest version's weights on the rollout devices."""
        if self._in_flight is not None:
            version, future = self._in_flight
            self._in_flight = None
            began = time.perf_counter()
            self.newest = (version, future.result())
            self._sync_waited += time.perf_counter() - began

    # -- one epoch -------------------------------------------------------------------------------------------

    def train_step(self, epoch: int, examples: list[Example], scorer: Scorer) -> StepResult:
        if epoch != self.finished:
            raise RuntimeError(f"asynchronous GRPO trains batch {self.finished} next, not {epoch}")
        if self.worker is None:
            self._start()
        self._submit(examples)
        clock, began = PhaseClock(), time.perf_counter()
        trainer_version = self.schedule.trainer_version(epoch)
        while True:                  # deterministic: batch `epoch`, once; free-running: the next fresh one
            batch = self.next_batch
            out = self.worker.result(batch)
            version = self.worker.version_of(batch)
            if trainer_version - version <= self.schedule.max_staleness:
                break
            self.worker.forget(batch)     # free-running only: the schedule keeps every batch within max_staleness
            self.next_batch, self.dropped = batch + 1, self.dropped + 1
            self._submit(examples)
        waited = time.perf_counter() - began
        # kept by the worker until trained: a stop signal that cuts this epoch's scoring short leaves it to the
        # checkpoint of the epoch before
        train_began = self._now()
        result = self.train_on(out, scorer, clock, began, rollout_logprobs=not self._on_policy(batch))
        train_ended = self._now()
        self.worker.forget(batch)
        self.next_batch, self.finished = batch + 1, epoch + 1
        sync_seconds = self._sync()
        self._submit()                         # the new version's batches start while the runner logs
        result.metrics.update(self._async_metrics(epoch, version, waited, self.worker.waited_for_weights(),
                                                  sync_seconds))
        result.metrics.update(self._timeline(batch, train_began, train_ended))
        if self.free:
            result.metrics.update({"sample/dropped_stale_total": self.dropped, "async/batch": batch})
        return result

    def _async_metrics(self, epoch: int, version: int, waited: float, rollout_waited: float,
                       sync_seconds: float) -> dict[str, float]:
        """A step's waits, weight syncs and staleness (TRL's `sample/staleness_*`): epoch `epoch` trained on a batch
        of weights version `version`."""
        staleness = float(self.schedule.trainer_version(epoch) - version)
        sync_waited, self._sync_waited = self._sync_waited, 0.0
        return {"async/trainer_wait_s": waited, "async/rollout_wait_s": rollout_waited,
                "async/weight_sync_s": sync_seconds, "async/weight_sync_wait_s": sync_waited,
                "async/weight_syncs": self.sync.syncs,
                "async/weight_transfers": self.sync.transfers, "async/version": version,
                "sample/staleness_mean": staleness, "sample/staleness_max": staleness}

    def _timeline(self, batch: int, train_began: float, train_ended: float) -> dict[str, float]:
        """The step's timeline entries: its trainer interval, and its batch's generation interval (none for a batch
        a checkpoint stored; free-running, dropped batches' generations are let go unlogged)."""
        for k in [k for k in list(self._generated) if k < batch]:     # list(): the worker adds meanwhile
            del self._generated[k]
        out = {"async/train_began_s": train_began, "async/train_ended_s": train_ended}
        generated = self._generated.pop(batch, None)
        if generated is not None:
            out.update({"async/generate_began_s": generated[0], "async/generate_ended_s": generated[1]})
        return out

    # -- checkpoints -----------------------------------------------------------------------------------------

    def _slots(self) -> int:
        """Batches a checkpoint can hold as generated: at most max_staleness x weight_sync_steps (at least one
        slot, so the state's layout never changes)."""
        return max(self.schedule.max_staleness * self.schedule.weight_sync_steps, 1)

    def checkpoint_state(self) -> dict[str, Any]:
        """The synchronous state, plus `Schedule.checkpoint_plan`'s: the epochs finished, the newest version's
        weights (per layer) and every untrained batch of an older version as generated (waited for)."""
        out = super().checkpoint_state()
        plan = self.schedule.checkpoint_plan(self.finished)
        self._settle()
        if self.newest[0] != plan.version:     # the schedule's invariant; never write a checkpoint that resumes wrong
            raise RuntimeError(f"asynchronous GRPO's rollout holds weight version {self.newest[0]}, but a checkpoint "
                               f"after {self.finished} steps needs version {plan.version}")
        out["async"] = {"finished": np.asarray(self.finished, np.int64), "version": np.asarray(plan.version, np.int64),
                        "next_batch": np.asarray(self.next_batch, np.int64),
                        "dropped": np.asarray(self.dropped, np.int64),
                        "rollout_params": self._rollout_params(plan), **self._stored_batches(plan)}
        return out

    def _rollout_params(self, plan: CheckpointPlan) -> Any:
        """The newest version's weights as a checkpoint keeps them: per layer, on the rollout devices."""
        return self.learner.to_layer_layout(self.newest[1])

    def _stored_batches(self, plan: CheckpointPlan) -> dict[str, np.ndarray]:
        """`plan`'s batches stored as generated, in `_slots` slots (batch -1: an empty slot)."""
        rows, width = self.cfg.rollout.prompts_per_epoch * self.cfg.rollout.generations_per_prompt, \
            self.cfg.rollout.max_new_tokens
        n = self._slots()
        batches = np.full(n, -1, np.int32)
        tokens, logprobs = np.zeros((n, rows, width), np.int32), np.zeros((n, rows, width), np.float32)
        lengths, ended = np.zeros((n, rows), np.int32), np.zeros((n, rows), np.int32)
        stored = () if self.free else plan.stored       # free-running: batches in flight are generated again
        for k in stored:               # past the run's epochs (its end): generated now, for a run resumed longer
            if self.worker is not None and not self.worker.holds(k):
                self.worker.submit(Job(k, self.schedule.generation_version(k), self._examples_of(k)))
        for i, k in enumerate(stored):
            r = self._stored[k] if k in self._stored else self._host(self.worker.result(k).result)
            batches[i] = k
            tokens[i], logprobs[i], lengths[i], ended[i] = r["tokens"], r["logprobs"], r["lengths"], r["finished"]
        return {"batches": batches, "tokens": tokens, "logprobs": logprobs, "lengths": lengths,
                "finished_rows": ended}

    @staticmethod
    def _host(result: GenerationResult) -> dict[str, np.ndarray]:
        return {"tokens": np.asarray(result.tokens), "logprobs": np.asarray(result.logprobs),
                "lengths": np.asarray(result.lengths), "finished": np.asarray(result.finished, np.int32)}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self._restore_async(state["async"])

    def _restore_async(self, a: dict[str, Any]) -> None:
        """A checkpoint's asynchronous state: the schedule's position (and the weight syncs it took), the newest
        version's weights on the rollout devices and the batches stored as generated (handed to the worker when it
        starts)."""
        self.finished, self.next_batch, self.dropped = int(a["finished"]), int(a["next_batch"]), int(a["dropped"])
        self.sync.syncs = self.finished // self.schedule.weight_sync_steps     # the run's so far, as logged
        self.sync.transfers = self.sync.syncs * len(jax.tree.leaves(self.learner.state.params))
        self.newest = (int(a["version"]), self._placed_rollout(a["rollout_params"]))
        self._stored = {int(k): {"tokens": np.asarray(a["tokens"][i]), "logprobs": np.asarray(a["logprobs"][i]),
                                 "lengths": np.asarray(a["lengths"][i]),
                                 "finished": np.asarray(a["finished_rows"][i])}
                        for i, k in enumerate(np.asarray(a["batches"])) if k >= 0}

    def _placed_rollout(self, layer_params: Any) -> Any:
        """A checkpoint's rollout weights (per layer) on the rollout devices, in the training layout."""
        return self.sync.place(self.learner.to_training_layout(layer_params))

    def _restored_output(self, k: int, stored: dict[str, np.ndarray]) -> RolloutOutput:
        """A checkpoint's generated batch `k` as the worker would hand it over: its prompts encoded again (a pure
        function of its examples), its generation placed on the rollout devices."""
        examples = self._examples_of(k)
        g = self.cfg.rollout.generations_per_prompt
        ids, mask, truncated = self.rollout.encode(examples, self.model_config)
        place = lambda x: jax.device_put(x, self.rollout_rows)       # noqa: E731
        result = GenerationResult(place(stored["tokens"]), place(stored["logprobs"]), place(stored["lengths"]),
                                  place(stored["finished"].astype(bool)))
        return RolloutOutput([e for e in examples for _ in range(g)], np.repeat(ids, g, 0), np.repeat(mask, g, 0),
                             result, prompts_truncated=truncated)


def _fail_on_error(worker: RolloutWorker, sync: Future) -> None:
    """A finished sync that failed fails the worker's batches waiting for its weights (else they wait forever)."""
    error = sync.exception()
    if error is not None:
        worker.fail(error)
