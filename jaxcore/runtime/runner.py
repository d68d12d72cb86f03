"""The shared training loop for ES and GRPO: data, rollouts, scoring, logging, checkpoints, signals.

An algorithm plugs in through the `Algorithm` protocol; the `Runner` owns everything around it:

- epoch e's prompts are drawn from the task with seed (train.seed, e), so the data position is
  the epoch and a resumed run sees exactly the prompts an uninterrupted one would;
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

import copy
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxcore.agents import build_agent, run_episodes
from jaxcore.config.yaml_config import to_dict
from jaxcore.errors import OutputError, TaskConfigError, TrainingError, UserError  # noqa: F401  (re-exported)
from jaxcore.hf import model_checkpoint, tokenization  # modules: `load_any` is looked up at call time
from jaxcore.hf.convert import save_hf
from jaxcore.inference.generate import row_shards
from jaxcore.model.state import weight_moments
from jaxcore.outputs import check_output, check_parent, remove_tree
from jaxcore.parallel import sharding
from jaxcore.parallel.meshes import maybe_initialize_distributed
from jaxcore.parallel.rows import gather_rows
from jaxcore.rewards import Example, Scorer, ScoringStopped, Task, TaskError, get_task
from jaxcore.rewards.user_functions import task_with_rewards
from jaxcore.runtime import compile_cache
from jaxcore.runtime.algorithm import Algorithm
from jaxcore.runtime.checkpoint import TrainCheckpointer
from jaxcore.runtime.completions import print_completions, write_completions
from jaxcore.runtime.config import RolloutConfig
from jaxcore.runtime.metrics import MetricsLogger, import_plotting_beside, plot_rewards, read_metrics
from jaxcore.runtime.optim import check_learning_rate
from jaxcore.runtime.plan_check import check_fits, measured_prompt_tokens, model_config_of
from jaxcore.runtime.programs import ledger, process_start_time
from jaxcore.runtime.rollout import encode_rollout_prompts, function_means, sample, score_rows
from jaxcore.runtime.run_guard import OutDirLock, check_resume_compatible, data_fingerprint
from jaxcore.runtime.signals import StopSignal, interrupts_export

log = logging.getLogger(__name__)

EVAL_SEED = 0          # the held-out examples are drawn with this seed, whatever train.seed is
LOOKAHEAD = 8          # epochs whose examples the algorithm sees ahead, to make their programs beside earlier work


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of epoch `epoch`'s prompt sample (a pure function of the run seed and the epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def evaluate(model: Any, tokenizer: Any, examples: list[Example], scorer: Scorer, rollout: RolloutConfig, *,
             batch_size: int, eos_token_ids: tuple[int, ...] = (), row_sharding: Any = None,
             agent: Any = None, samples_per_prompt: int = 0) -> dict[str, Any]:
    """Completions for held-out examples, scored: mean reward, per-function means, samples. One greedy completion
    per example, or with `samples_per_prompt` k > 0 k completions sampled with the rollout's settings (TRL's
    `num_generations_eval`) from a fixed key, so that every evaluation of a run draws alike.

    The rollout's pieces (`jaxcore.runtime.rollout`): prompts encoded under the rollout's limits, `sample`d,
    `score_rows` (each process scores the rows it owns); `batch_size` rows per batch. With `row_sharding` (e.g.
    rows over a mesh axis, or replicated over a multi-process mesh) the batch lives on that mesh. With an `agent`
    (tools, environments) every row is a multi-turn episode (`jaxcore.agents`), its environment's reward and
    turn/tool statistics logged too.
    """
    if samples_per_prompt:
        examples = [e for e in examples for _ in range(samples_per_prompt)]
    rewards: list[np.ndarray] = []
    extra_names = agent.reward_names if agent is not None else []
    per_function: dict[str, list[np.ndarray]] = {name: [] for name in [*scorer.reward_fns, *extra_names]}
    episode_metrics: list[dict[str, float]] = []
    samples: list[dict[str, str]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        count = len(chunk)
        rows = chunk + chunk[-1:] * (-count % row_shards(row_sharding))   # a multiple of the row shards
        key = jax.random.fold_in(jax.random.key(EVAL_SEED), start) if samples_per_prompt else None
        if agent is None:
            ids, mask, _ = encode_rollout_prompts(tokenizer, rows, rollout, model.config)
            result = sample(model, ids, mask, rollout, key=key, eos_token_ids=eos_token_ids,
                            pad_token_id=tokenizer.pad_token_id, row_sharding=row_sharding, logprobs=False)
            scores = score_rows(result, rows, tokenizer, scorer, padding_from=count)
        else:
            episodes = run_episodes(agent, model, tokenizer, rows, rollout, key=key, eos_token_ids=eos_token_ids,
                                    pad_token_id=tokenizer.pad_token_id, row_sharding=row_sharding)
            result = episodes.result
            scores = score_rows(result, rows, tokenizer, scorer, **episodes.scoring(), padding_from=count)
            episode_metrics.append(episodes.metrics())
        rewards.append(scores.rewards_B[:count])
        for name, values in scores.per_function.items():
            per_function[name].append(values[:count])
        if len(samples) < 3:
            shown = min(3 - len(samples), count)
            texts = tokenization.decode_completions(tokenizer, gather_rows(result.tokens)[:shown],
                                                    gather_rows(result.lengths)[:shown])
            samples.extend({"prompt": e.prompt, "completion": t} for e, t in zip(chunk, texts))
    rewards_B = np.concatenate(rewards).astype(np.float32) if rewards else np.zeros(0, np.float32)
    means = function_means({name: np.concatenate(v) if v else np.zeros(0) for name, v in per_function.items()})
    episodes = {f"eval/{k}": float(np.mean([m[k] for m in episode_metrics])) for k in
                (episode_metrics[0] if episode_metrics else ()) if k.startswith(("tools/", "episodes/"))}
    return {"eval/reward": float(rewards_B.mean()), **{f"eval/rewards/{name}/mean": m for name, m in means.items()},
            **episodes, "eval/samples": samples}


def make_task(section: Any, functions: Sequence[Any] = (), weights: Sequence[float] | None = None,
              timeout_s: float | None = None, *, scored_by_environment: bool = False,
              chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """The configured task; a bad task name or option is a `TaskConfigError` (one line, exit 2).

    `functions` (user functions, reward models, built-in names; see `rewards.functions`) replace the
    task's rewards; their probe calls are limited to `timeout_s` (default: `rewards.timeout_s`'s default).
    `scored_by_environment` (an environment defines `get_reward`, TRL's reward source that makes reward
    functions optional): a file task with neither `functions` nor `task.options.reward` then has no reward
    functions of its own (not the default exact_match) and needs no answer column. `chat_template_kwargs`
    reach a reward model's chat template (TRL's).
    """
    options = dict(section.options)
    environment_only = scored_by_environment and not functions and section.name == "file" and "reward" not in options
    if (functions or environment_only) and section.name == "file":
        options.setdefault("require_answer", False)
    try:
        task = get_task(section.name, **options)
    except TypeError as err:
        raise TaskConfigError(f"task {section.name!r}: {err}") from err
    except ValueError as err:
        if isinstance(err, (TaskConfigError, TaskError)):
            raise
        raise TaskConfigError(str(err)) from err
    if environment_only:
        return dataclasses.replace(task, reward_fns={}, reward_weights={})
    if not functions:
        return task
    return task_with_rewards(task, functions, weights, *(() if timeout_s is None else (timeout_s,)),
                             chat_template_kwargs=chat_template_kwargs)


Observer = Callable[[str, int, "dict[str, Any] | None"], "bool | None"]
"""Told of a run's events: ("log", step, metrics) after each logged step (True: end the run there, with a
checkpoint and the final export, as a last epoch would) and ("train_end", step, None)."""


class Runner:
    """Runs an algorithm for `cfg.train.epochs` epochs with evaluation, logging and checkpoints."""

    def __init__(self, cfg: Any, algorithm: Algorithm, tokenizer: Any, task: Task, *,
                 eos_token_ids: tuple[int, ...] = (), examples_per_epoch: int | None = None,
                 base_weights: dict[str, list[float]] | None = None, observer: Observer | None = None):
        self.cfg = cfg
        self.algorithm = algorithm
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.base_weights = base_weights      # fingerprint of the weights loaded at start (stored, checked on resume)
        self.task = task
        self.observer = observer or (lambda event, step, metrics: False)
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
            self._drawn[epoch] = self.task.examples("train", self.examples_per_epoch,
                                                    epoch_seed(self.cfg.train.seed, epoch))
        return self._drawn[epoch]

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
        model = self.algorithm.eval_model()
        return evaluate(model, self.tokenizer, self.eval_examples, scorer, self.cfg.rollout,
                        batch_size=t.eval_batch_size, eos_token_ids=self.eos_token_ids,
                        row_sharding=self.algorithm.eval_sharding, agent=getattr(self.algorithm, "agent", None),
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


def fresh_run_over_checkpoints(directory: Path) -> TrainingError:
    """The refusal of a run without --resume whose out_dir already holds checkpoints."""
    return TrainingError(f"{directory} already holds checkpoints: pass --resume to continue, "
                         "or choose another train.out_dir")


def refuse_fresh_run_over_checkpoints(out_dir: str | Path) -> None:
    """Raise `fresh_run_over_checkpoints` when out_dir/checkpoints holds a checkpoint (run before loading)."""
    directory = Path(out_dir).absolute() / "checkpoints"
    if not directory.is_dir():
        return
    checkpointer = TrainCheckpointer(directory, async_save=False)
    try:
        step = checkpointer.latest_step()
    finally:
        checkpointer.close()
    if step is not None:
        raise fresh_run_over_checkpoints(directory)


def state_shapes(state: Any) -> dict[str, list[int]]:
    """{tree path: shape} of every array in a checkpoint state (to name a model change on resume)."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in leaves}


def run_training(cfg: Any, algorithm: type[Algorithm],
                 resume: bool = False, allow_changes: bool = False, *, build_task: Callable[..., Any] | None = None,
                 model: Any = None, tokenizer_dir: str | None = None, tools: Sequence[Any] = (),
                 environment_factory: Any = None, observer: Observer | None = None,
                 rollout_func: Any = None, owner: Any = None) -> dict[str, Any]:
    """Take the out_dir lock, load cfg.model and its tokenizer, build `algorithm(model, tokenizer, cfg,
    eos_token_ids=...)`, run the `Runner`, and export `algorithm.export_model()` to out_dir/final_hf on
    process 0 (when `train.export_hf`).

    The lock comes first, so a second run on a busy out_dir is refused at once rather than after building
    the task and loading a model; it is held through the export and released on every exit.
    `build_task` (called under the lock with `scored_by_environment=`, see `make_task`; default: the config's
    task) and an already loaded `model` (with `tokenizer_dir`), and `tools` / `environment_factory` (added to
    `rollout.tools` / replacing `rollout.environment_factory`: a multi-turn rollout, `jaxcore.agents`), or a
    `rollout_func` (TRL's, called with `owner` as its trainer) come from the Python API
    (`jaxcore.api`). Shared by `jaxcore es` and `jaxcore grpo`; bad input (no model path, no tokenizer, an
    algorithm setting the algorithm rejects with ValueError) is a one-line `UserError`.
    """
    check_run_outputs(cfg, resume)                # before the lock creates out_dir: one line, nothing written
    compile_cache.enable(cfg.train.compilation_cache)   # before anything compiles
    d = cfg.distributed
    if d.coordinator:                           # first: the lock's name depends on the process index
        maybe_initialize_distributed(d.coordinator, d.num_processes, d.process_id)
    lock_name = ".lock" if jax.process_index() == 0 else f".lock.process{jax.process_index()}"
    with OutDirLock(cfg.train.out_dir, lock_name):
        summary = _load_train_export(cfg, algorithm, resume, allow_changes, build_task=build_task, model=model,
                                     tokenizer_dir=tokenizer_dir, tools=tools, environment_factory=environment_factory,
                                     observer=observer, rollout_func=rollout_func, owner=owner)
    compile_cache.log_stats()
    return summary


def check_run_outputs(cfg: Any, resume: bool) -> None:
    """What a run will write, checked before it starts (each a one-line error): train.out_dir is a directory
    (or can be made one) that can be written; out_dir/metrics.jsonl and reward.png are not directories, and
    out_dir/checkpoints is not a file (found before training, not after it); a fresh run finds no earlier run's
    checkpoints, metrics.jsonl or reward.png there (it would replace them: they are continued with --resume);
    out_dir/final_hf (with `train.export_hf`) is not a link or a file,
    is not model.path (or inside it, or around it), and holds nothing from an earlier run unless resuming; the
    optimiser's learning rate is finite at every step (`check_learning_rate`)."""
    out = Path(cfg.train.out_dir)
    if out.is_symlink() and not out.is_dir():
        raise OutputError(f"train.out_dir {out} is a symbolic link to nothing (or to a file)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"train.out_dir {out} exists and is not a directory")
    check_parent(out / "checkpoints", "train.out_dir", shown=out)       # out_dir itself, or the folder it goes in
    for written, is_dir in (("metrics.jsonl", False), ("reward.png", False), ("checkpoints", True)):
        path = out / written
        if not is_dir and path.is_symlink():          # the log is appended through it: it would write elsewhere
            raise OutputError(f"train.out_dir's {written} {path} is a symbolic link; a run writes a file at it "
                              "(move it away, or choose another train.out_dir)")
        if path.exists() and path.is_dir() != is_dir:
            raise OutputError(f"train.out_dir's {written} {path} is {'not ' if is_dir else ''}a directory; a run "
                              f"writes {'checkpoints in' if is_dir else 'a file at'} it (move it away, or choose "
                              "another train.out_dir)")
    if not resume:
        refuse_fresh_run_over_checkpoints(out)            # the earlier run's checkpoints: the clearer refusal
        for written in ("metrics.jsonl", "reward.png"):
            path = out / written
            if path.is_file() and path.stat().st_size > 0:
                raise OutputError(f"train.out_dir {out} already holds {written}, which a fresh run would replace: "
                                  "pass --resume to continue that run, or choose another train.out_dir")
    if cfg.train.export_hf:
        check_output(out / "final_hf", inputs=(cfg.model.path or None,), overwrite=resume, name="final_hf",
                     overwrite_hint="continue that run with --resume")
    check_learning_rate(cfg.optimizer, cfg.train.epochs)


def _load_train_export(cfg: Any, algorithm_type: type[Algorithm], resume: bool,
                       allow_changes: bool, *, build_task: Callable[..., Any] | None, model: Any,
                       tokenizer_dir: str | None, tools: Sequence[Any] = (),
                       environment_factory: Any = None, observer: Observer | None = None,
                       rollout_func: Any = None, owner: Any = None) -> dict[str, Any]:
    """`run_training`'s work under the out_dir lock."""
    stale = Path(cfg.train.out_dir).glob(".final_hf.tmp-*") if jax.process_index() == 0 else ()   # the exporter's
    for copy_left in stale:                 # an export stopped mid-write: this out_dir's, under its lock
        log.info("removing %s, left by an export that was stopped", copy_left)
        remove_tree(copy_left)
    if (tools or environment_factory is not None or rollout_func is not None) and not cfg.rollout.multi_turn:
        cfg = copy.copy(cfg)                # the caller's config stays as it was
        cfg.rollout = cfg.rollout.with_agent()      # episodes: the planner and dr_grpo count max_episode_tokens
    if not resume:
        refuse_fresh_run_over_checkpoints(cfg.train.out_dir)                  # before anything is built or loaded
    agent = build_agent(cfg.rollout, cfg.rewards, tools=tools, environment_factory=environment_factory,
                        rollout_func=rollout_func, owner=owner)
    try:
        return _train_export(cfg, algorithm_type, resume, allow_changes, agent, build_task=build_task, model=model,
                             tokenizer_dir=tokenizer_dir, observer=observer)
    finally:
        if agent is not None:
            agent.close()                       # the tools' worker processes


def _train_export(cfg: Any, algorithm_type: type[Algorithm], resume: bool, allow_changes: bool, agent: Any, *,
                  build_task: Callable[..., Any] | None, model: Any, tokenizer_dir: str | None,
                  observer: Observer | None = None) -> dict[str, Any]:
    """`_load_train_export` once the run's `agent` (tools, environments; None for a single-turn run) is built: the
    task (reward functions optional when an environment scores, as in TRL), the model, the training, the export."""
    scored_by_environment = bool(agent is not None and agent.reward_names)
    task = (build_task(scored_by_environment=scored_by_environment) if build_task is not None else
            make_task(cfg.task, cfg.rewards.functions, cfg.rewards.weights, cfg.rewards.timeout_s,
                      scored_by_environment=scored_by_environment,
                      chat_template_kwargs=cfg.rollout.chat_template_kwargs))
    if not task.reward_fns and not scored_by_environment:
        raise UserError("no reward source: give reward functions (rewards.functions, reward_funcs=) or an "
                        "environment_factory whose environment defines get_reward()")
    model_cfg = model.config if model is not None else model_config_of(cfg)     # config.json only, read once
    reason = check_fits(cfg, algorithm_type, model_cfg, measured_prompt_tokens(cfg, task, agent, tokenizer_dir,
                                                                               model_cfg))
    if reason:
        raise UserError(reason)
    if model is None:
        if not cfg.model.path:
            raise UserError("model.path is not set (an HF directory or a jaxcore checkpoint)")
        model, tok_dir = model_checkpoint.load_any(cfg.model.path, cfg.model.dtype, remat=cfg.model.remat,
                                                   **algorithm_type.load_targets(cfg))   # each weight into its shard
    else:
        tok_dir = tokenizer_dir or cfg.model.path or None
    if tok_dir is None:
        raise UserError(f"{cfg.model.path}: no tokenizer files")
    tokenizer = tokenization.with_chat_template_kwargs(tokenization.load_tokenizer(tok_dir),
                                                      cfg.rollout.chat_template_kwargs)
    eos = tokenization.eos_token_ids(tokenizer, model.config.hf_config)
    base_weights = weight_moments(model)          # before the algorithm owns (and updates) the weights
    try:
        algorithm = algorithm_type(model, tokenizer, cfg, eos_token_ids=eos, **({"agent": agent} if agent else {}))
    except ValueError as err:
        raise UserError(str(err)) from err
    del model                                   # the algorithm owns the weights from here on
    summary = Runner(cfg, algorithm, tokenizer, task, eos_token_ids=eos, base_weights=base_weights,
                     observer=observer).run(
        resume=resume, allow_changes=allow_changes)
    if cfg.train.export_hf and summary["stopped_by"] is None:
        final_hf = Path(cfg.train.out_dir) / "final_hf"
        with interrupts_export(f"the export to {final_hf}"):
            final = sharding.gathered_model(algorithm.export_model())     # every process takes part in the gather
            if jax.process_index() == 0:
                summary["final_hf"] = str(save_hf(final, final_hf, tokenizer_dir=tok_dir,
                                                  inputs=(cfg.model.path or None,)))
                summary.update(algorithm.export_extra(cfg.train.out_dir, cfg.model.path))
    return summary
