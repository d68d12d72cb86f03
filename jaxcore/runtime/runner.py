"""The shared training loop for ES and GRPO: data, rollouts, scoring, logging, checkpoints, signals.

An algorithm plugs in through the `Algorithm` protocol; the `Runner` owns everything around it:

- a dataset is walked in passes, as TRL's RepeatSampler walks it: each pass orders the rows by (train.seed, pass)
  (`train.shuffle` false: the dataset's order) and epoch k of the pass takes the k-th slice of prompts_per_epoch
  rows (`epoch_rows`); a generator task draws epoch e's prompts with seed (train.seed, e). Either way the data
  position is the epoch and a resumed run sees exactly the prompts an uninterrupted one would;
- held-out evaluation (`eval_prompts` examples, greedy or sampled) before training, every `eval_every` epochs and
  after the last; with `eval_every` 0 only after the last, with -1 never;
- metrics to JSONL + TensorBoard, a tqdm bar with ETA and live reward, a reward plot at the end;
- orbax checkpoints every `checkpoint_every` epochs (async, atomic, `max_to_keep`), `resume`;
- SIGTERM/SIGINT: finish the current epoch, write a checkpoint, exit cleanly; an epoch whose scoring the
  signal cut short (its rewards would be partly fallbacks) is dropped instead, and the checkpoint is the one
  after the epoch before it, so that a resumed run equals an uninterrupted one;
- a step whose fitness/loss/update is NaN/Inf is skipped and logged; after `max_bad_steps` in a
  row the run stops with `TrainingError`, the last good checkpoint intact.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxcore.config.yaml_config import to_dict
from jaxcore.errors import OutputError, TaskConfigError, TaskError, TrainingError, UserError  # noqa: F401  (re-exported)
from jaxcore.rewards import Example, Scorer, ScoringStopped, Task
from jaxcore.rewards.types import TrainerState
from jaxcore.runtime.algorithm import Algorithm
from jaxcore.runtime.checkpoint import TrainCheckpointer
from jaxcore.runtime.completions import print_completions, write_completions
from jaxcore.runtime.evaluation import EVAL_SEED
from jaxcore.runtime.metrics import MetricsLogger, import_plotting_beside, plot_rewards, read_metrics
from jaxcore.runtime.programs import ledger, process_start_time
from jaxcore.runtime.run_guard import check_resume_compatible, data_fingerprint
from jaxcore.runtime.signals import StopSignal

log = logging.getLogger(__name__)

LOOKAHEAD = 8          # epochs whose examples the algorithm sees ahead, to make their programs beside earlier work


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of epoch `epoch`'s prompt sample (a pure function of the run seed and the epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def epoch_rows(rows: int, per_epoch: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The dataset rows epoch `epoch` trains on, as TRL's RepeatSampler walks a dataset of `rows` rows: a pass is
    rows // per_epoch epochs over one order of the rows (a permutation seeded by (seed, pass), or the dataset's own
    order without `shuffle`), epoch k of a pass taking its k-th slice of `per_epoch` rows, so every row is trained
    once per pass; the rows % per_epoch rows left at the end of a pass's order are not drawn in that pass (TRL drops
    the incomplete batch). A pure function of its arguments: a resumed run draws what an uninterrupted one would."""
    pass_index, k = divmod(epoch, rows // per_epoch)
    order = np.random.default_rng([seed, pass_index]).permutation(rows) if shuffle else np.arange(rows)
    return order[k * per_epoch:(k + 1) * per_epoch]


Observer = Callable[[str, int, "dict[str, Any] | None"], "bool | None"]
"""Told of a run's events: ("log", step, metrics) after each logged step (True: end the run there, with a
checkpoint and the final export, as a last epoch would) and ("train_end", step, None). An observer with a `state`
attribute (a `TrainerState`, as jaxcore.trl's callbacks have) gets that state kept current by the run."""


class Runner:
    """Runs an algorithm for `cfg.train.epochs` epochs with evaluation, logging and checkpoints."""

    def __init__(self, cfg: Any, algorithm: Algorithm, task: Task, *, examples_per_epoch: int | None = None,
                 base_weights: dict[str, list[float]] | None = None, observer: Observer | None = None):
        self.cfg = cfg
        self.algorithm = algorithm
        self.base_weights = base_weights      # fingerprint of the weights loaded at start (stored, checked on resume)
        self.task = task
        self.observer = observer or (lambda event, step, metrics: False)
        # TRL's trainer_state: what the reward functions get (`_advance` keeps it current)
        self.state: TrainerState = getattr(observer, "state", None) or TrainerState()
        self.steps_per_epoch = cfg.total_steps // cfg.train.epochs        # optimizer steps
        self.data = data_fingerprint(task)         # stored, checked on resume: a changed dataset file is refused
        self.examples_per_epoch = examples_per_epoch or cfg.rollout.prompts_per_epoch
        self.out_dir = Path(cfg.train.out_dir)
        self.is_main = jax.process_index() == 0
        self.checkpointer = TrainCheckpointer(self.out_dir / "checkpoints", max_to_keep=cfg.train.max_to_keep)
        eval_prompts = cfg.train.eval_prompts
        available = task.num_examples("eval")          # None: a generator, any number
        if available is not None and available < eval_prompts:
            eval_prompts = available                      # a dataset's whole eval split
            log.info("evaluating on all %d eval examples of %s", eval_prompts, task.name)
        self.eval_examples = self.task.examples("eval", eval_prompts, EVAL_SEED)   # the same for every train.seed
        self._drawn: dict[int, list[Example]] = {}

    def _scorer(self) -> Scorer:
        r = self.cfg.rewards
        return Scorer(self.task.reward_fns, self.task.reward_weights, num_workers=r.num_workers,
                      timeout_s=r.timeout_s, fallback=r.fallback)

    def _save(self, epoch: int, *, wait: bool = False) -> None:
        state = self.algorithm.checkpoint_state()
        meta = {"epoch": epoch, "data_position": epoch + 1, "config": to_dict(self.cfg),
                "algorithm": self.algorithm.name, "shapes": state_shapes(state), "base_weights": self.base_weights,
                "data": self.data}
        self.checkpointer.save(epoch, state, meta, wait=wait)

    def _stopped(self, summary: dict[str, Any], signum: int, epoch: int) -> None:
        """Record a stop after `epoch`, the last epoch applied (start - 1 if none was in this run), and make sure
        its checkpoint exists: written now (waited for) unless a periodic save wrote it. A fresh run stopped before
        its first epoch finished has none."""
        self.checkpointer.wait()
        saves = self.cfg.train.checkpoint_every >= 0          # -1: the run keeps no checkpoint, not even now
        if saves and epoch >= 0 and epoch not in self.checkpointer.all_steps():
            self._save(epoch, wait=True)
        summary["stopped_by"] = signal.Signals(signum).name
        summary["checkpoint"] = str(self.checkpointer.directory / str(epoch)) if epoch >= 0 and saves else None
        log.warning("stopped by %s after epoch %d; %s", summary["stopped_by"], epoch,
                    "resume with --resume" if summary["checkpoint"] else
                    "no checkpoint kept (train.checkpoint_every -1)" if not saves else
                    "no epoch finished, nothing to resume")

    def _examples(self, epoch: int) -> list[Example]:
        """Epoch `epoch`'s training examples (drawn once, whether first for the lookahead or for the epoch)."""
        if epoch not in self._drawn:
            t, rows = self.cfg.train, self.task.num_examples("train")
            if rows is None:                            # a generator: any number of examples, drawn per epoch
                drawn = self.task.examples("train", self.examples_per_epoch, epoch_seed(t.seed, epoch))
            else:                                       # a dataset: walked in passes
                if self.examples_per_epoch > rows:
                    raise TaskError(f"{self.task.name}: asked for {self.examples_per_epoch} train examples per "
                                    f"epoch, only {rows} exist")
                drawn = [self.task.train[i] for i in epoch_rows(rows, self.examples_per_epoch, t.seed, epoch,
                                                                 t.shuffle)]
            self._drawn[epoch] = drawn
        return self._drawn[epoch]

    def _advance(self, epoch: int) -> None:
        """The run's `TrainerState` once `epoch` epochs are done, as TRL's reward functions see it: the optimizer steps
        taken and the run's, and the passes over the dataset taken (a generator task: the epochs)."""
        rows = self.task.num_examples("train")
        s = self.state
        s.global_step, s.max_steps = epoch * self.steps_per_epoch, self.cfg.train.epochs * self.steps_per_epoch
        s.epoch = epoch / max(rows // self.examples_per_epoch, 1) if rows is not None else float(epoch)
        s.is_world_process_zero = self.is_main

    def _resume(self, allow_changes: bool = False) -> int:
        """Restore the newest checkpoint that restores and matches the config; returns the first epoch to run."""
        target = self.algorithm.checkpoint_state()
        config, shapes = to_dict(self.cfg), state_shapes(target)
        state, meta = self.checkpointer.restore_newest(
            target, lambda meta: check_resume_compatible(meta, config, self.algorithm.name, shapes, allow_changes,
                                                         self.base_weights, self.data))
        self.algorithm.restore_state(state)
        log.info("resumed from %s at epoch %d", self.checkpointer.directory, meta["epoch"])
        return int(meta["epoch"]) + 1

    def _evaluate(self, scorer: Scorer) -> dict[str, Any]:
        t = self.cfg.train
        return self.algorithm.evaluate(self.eval_examples, scorer, batch_size=t.eval_batch_size,
                                       samples_per_prompt=t.eval_samples_per_prompt)

    def run(self, resume: bool = False, allow_changes: bool = False) -> dict[str, Any]:
        """Train; returns a summary (first/last eval reward, epochs run, stop reason)."""
        if not resume and self.checkpointer.latest_step() is not None:
            self.checkpointer.close()
            raise fresh_run_over_checkpoints(self.checkpointer.directory)
        try:
            return self._run(resume, allow_changes)
        except BaseException:
            self._close_quietly()           # pending saves finish, so the last good checkpoint is committed
            raise
        finally:
            self.algorithm.close()

    def _last_good(self) -> str:
        """Where the last good checkpoint is, named only if one was written (pending saves are waited for)."""
        self.checkpointer.wait()
        step = self.checkpointer.latest_step()
        if step is None:
            return f"no checkpoint was written to {self.checkpointer.directory}"
        return f"last good checkpoint: {self.checkpointer.directory / str(step)}"

    def _close_quietly(self) -> None:
        try:
            self.checkpointer.close()
        except Exception as err:  # noqa: BLE001 -- the original error is the one to report
            log.warning("%s", err)

    def _run(self, resume: bool, allow_changes: bool) -> dict[str, Any]:
        t = self.cfg.train
        start = self._resume(allow_changes) if resume else 0
        logger = MetricsLogger(self.out_dir if self.is_main else self.out_dir / f"process{jax.process_index()}",
                               tensorboard=t.tensorboard and self.is_main, resume_after=start if resume else None)
        summary: dict[str, Any] = {"start_epoch": start, "stopped_by": None}
        process_started = process_start_time()      # time_to_first_step counts start-up and loading too
        if self.is_main and start < t.epochs:
            import_plotting_beside()                 # for the reward plot at the end
        bad_steps = 0
        bar = tqdm(range(start, t.epochs), initial=start, total=t.epochs, desc="train", unit="epoch",
                   disable=not (t.progress and self.is_main), file=sys.stderr, dynamic_ncols=True)
        with self._scorer() as scorer, StopSignal(on_signal=scorer.interrupt) as stop:
            epoch = start - 1
            scorer.trainer_state = self.state
            self._advance(start)
            self.algorithm.examples_ahead(self._examples)
            # the first epochs' programs are made beside the evaluation before training and the first rollout
            self.algorithm.prepare([self._examples(e) for e in range(start, min(start + LOOKAHEAD, t.epochs))])
            if start == 0 and t.eval_every > 0:
                try:
                    first = self._evaluate(scorer)
                    logger.log(0, {k: v for k, v in first.items() if k != "eval/samples"})
                    self.observer("log", 0, {k: v for k, v in first.items() if k != "eval/samples"})
                    summary["eval_reward_before"] = first["eval/reward"]
                except ScoringStopped:                  # stopped before training: the loop below runs no epoch
                    pass
            for epoch in bar:
                if stop.received:                       # the signal came before the first epoch began
                    epoch -= 1
                    break
                examples = self._examples(epoch)
                del self._drawn[epoch]
                if epoch + LOOKAHEAD < t.epochs:
                    self.algorithm.prepare([self._examples(epoch + LOOKAHEAD)])
                began = time.perf_counter()
                self._advance(epoch)
                try:
                    result = self.algorithm.train_step(epoch, examples, scorer)
                except ScoringStopped:       # the stop cut this epoch's scoring short: none of it was applied
                    log.warning("epoch %d dropped: a stop signal cut its scoring short", epoch)
                    epoch -= 1
                    break
                metrics = {**result.metrics, "epoch_time": time.perf_counter() - began, "skipped": result.skipped}
                if process_started is not None:             # seconds since the process started, load included
                    metrics["run_time"] = time.time() - process_started
                    summary.setdefault("time_to_first_step", metrics["run_time"])
                if result.skipped:
                    bad_steps += 1
                    log.warning("epoch %d skipped (%s); %d bad step(s) in a row", epoch, result.reason, bad_steps)
                    if bad_steps >= t.max_bad_steps:
                        logger.log(epoch + 1, metrics)
                        logger.close()
                        raise TrainingError(f"{bad_steps} consecutive bad steps ({result.reason}); stopped at epoch "
                                            f"{epoch}; {self._last_good()}")
                else:
                    bad_steps = 0
                last = epoch == t.epochs - 1
                due = t.eval_every >= 0 and (last or (t.eval_every and (epoch + 1) % t.eval_every == 0))
                if due and not stop.received:         # a stop signal's grace period is short: checkpoint first
                    self._advance(epoch + 1)
                    try:
                        metrics.update(self._evaluate(scorer))
                        log.info("epoch %d held-out reward %.4f; sample: %s", epoch, metrics["eval/reward"],
                                 metrics["eval/samples"][0] if metrics["eval/samples"] else "")
                    except ScoringStopped:            # the epoch itself is complete; only its evaluation is lost
                        pass
                metrics.pop("eval/samples", None)
                logger.log(epoch + 1, metrics)
                if result.completions is not None and self.is_main:
                    write_completions(self.out_dir, epoch + 1, result.completions)
                    print_completions(result.completions, epoch + 1, t.completions_to_print)
                asked_to_stop = bool(self.observer("log", epoch + 1, metrics))     # a callback may end the run here
                bar.set_postfix({k: f"{metrics[k]:.3f}" for k in ("reward", "eval/reward") if k in metrics})
                periodic = t.checkpoint_every > 0 and (epoch + 1) % t.checkpoint_every == 0
                if ((periodic or last or asked_to_stop) and t.checkpoint_every >= 0 and not result.skipped
                        and not stop.received):
                    self._save(epoch)
                if stop.received or asked_to_stop:
                    break
            if stop.received:
                self._stopped(summary, stop.received, epoch)
            summary["last_epoch"] = epoch
            self.observer("train_end", epoch + 1, None)
        bar.close()
        self.checkpointer.close()
        logger.close()
        summary["compile"] = making_programs(process_started)
        before, after = self._evals_before_and_after(logger.path)
        summary["eval_reward_before"] = summary.get("eval_reward_before", before)   # a resumed run: from its log
        summary["eval_reward_after"] = after
        if self.is_main and summary["stopped_by"] is None:
            plot_rewards(logger.path, self.out_dir / "reward.png", title=f"{self.cfg.task.name}")
        return summary

    @staticmethod
    def _evals_before_and_after(metrics_path: Path) -> tuple[float | None, float | None]:
        """(held-out reward before training, i.e. logged at step 0, or None; the last one logged, or None)."""
        evals = [(r["step"], r["eval/reward"]) for r in read_metrics(metrics_path) if "eval/reward" in r]
        before = next((reward for step, reward in evals if step == 0), None)
        return before, (evals[-1][1] if evals else None)


def making_programs(since: float | None) -> dict[str, Any]:
    """The run's making of programs since `since` (process start; None: since the ledger listened): the seconds
    on the main thread (what the run waited for) and beside it, per stage, the programs and the cache's hits."""
    main = ledger().totals(since or 0.0, thread=threading.main_thread().ident)
    ahead = ledger().totals(since or 0.0, exclude_thread=threading.main_thread().ident)
    return {"main_s": round(main.seconds, 3), "ahead_s": round(ahead.seconds, 3),
            **main.metrics(prefix=""), "ahead_programs": ahead.programs, "ahead_hits": ahead.hits}


def state_shapes(state: Any) -> dict[str, list[int]]:
    """{tree path: shape} of every array in a checkpoint state (to name a model change on resume)."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in leaves}


def fresh_run_over_checkpoints(directory: Path) -> TrainingError:
    """The refusal of a run without --resume whose out_dir already holds checkpoints."""
    return TrainingError(f"{directory} already holds checkpoints: pass --resume to continue, "
                         "or choose another train.out_dir")
