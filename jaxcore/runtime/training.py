"""A training run from its config (`run_training`, shared by `jaxcore es`, `jaxcore grpo` and the Python API): the
task, the checks of what the run will write, the out_dir lock, the model and tokenizer loaded once, the algorithm
on the `Runner`, and the export of the result."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from jaxcore.agents import build_agent
from jaxcore.errors import OutputError, TaskConfigError, UserError
from jaxcore.hf import model_checkpoint, tokenization  # modules: `load_any` is looked up at call time
from jaxcore.hf.convert import save_hf
from jaxcore.model.state import weight_moments
from jaxcore.outputs import check_output, check_parent, refuse_special, remove_tree
from jaxcore.parallel import sharding
from jaxcore.parallel.meshes import maybe_initialize_distributed
from jaxcore.rewards import TaskError, get_task
from jaxcore.rewards.user_functions import task_with_rewards
from jaxcore.runtime import compile_cache
from jaxcore.runtime.algorithm import Algorithm
from jaxcore.runtime.checkpoint import TrainCheckpointer
from jaxcore.runtime.optim import check_learning_rate
from jaxcore.runtime.plan_check import check_fits, measured_prompt_tokens, model_config_of
from jaxcore.runtime.rollout import Rollout
from jaxcore.runtime.run_guard import OutDirLock
from jaxcore.runtime.runner import Observer, Runner, fresh_run_over_checkpoints
from jaxcore.runtime.signals import interrupts_export

log = logging.getLogger(__name__)


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
    task) and an already loaded `model`, `tokenizer_dir` (default: the model's tokenizer), and `tools` /
    `environment_factory` (added to `rollout.tools` / replacing `rollout.environment_factory`: a multi-turn rollout,
    `jaxcore.agents`), or a `rollout_func` (TRL's, called with `owner` as its trainer) come from the Python API
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
    (or can be made one) that can be written, every entry the run writes in it is of the kind it writes
    (`check_out_dir_entries`), and the optimiser's learning rate is finite at every step (`check_learning_rate`)."""
    out = Path(cfg.train.out_dir)
    if out.is_symlink() and not out.is_dir():
        raise OutputError(f"train.out_dir {out} is a symbolic link to nothing (or to a file)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"train.out_dir {out} exists and is not a directory")
    check_parent(out / "checkpoints", "train.out_dir", shown=out)       # out_dir itself, or the folder it goes in
    check_out_dir_entries(cfg, resume)
    check_learning_rate(cfg.optimizer, cfg.train.epochs)


# A completions log the run writes in out_dir/completions (`jaxcore.runtime.completions.write_completions`).
COMPLETIONS_LOG = "completions_*.parquet"


def out_dir_entries(cfg: Any) -> list[tuple[str, str | None]]:
    """The entries of train.out_dir a run of `cfg` writes: (name, None for a file, else what it writes in that
    directory). The exports (final_hf, final_adapter) are checked as outputs of their own (`check_out_dir_entries`)."""
    t = cfg.train
    entries: list[tuple[str, str | None]] = [(".lock", None), ("metrics.jsonl", None), ("reward.png", None),
                                             ("checkpoints", "checkpoints")]
    if t.tensorboard:
        entries.append(("tensorboard", "TensorBoard's event files"))
    if t.log_completions:
        entries.append(("completions", "its completions logs"))
    return entries


def check_out_dir_entries(cfg: Any, resume: bool) -> None:
    """Every entry of train.out_dir the run will write, checked for its kind before training, in one place (each a
    one-line `OutputError` naming the path; before, a named pipe at metrics.jsonl hung the run, one at reward.png
    failed every resume after training, a file at completions failed after the first logged step):

    - a file the run writes (the lock, metrics.jsonl, reward.png, each completions log) is not a symbolic link, a
      special file (a named pipe, a device: `refuse_special`) or a directory; a directory it writes in
      (checkpoints, tensorboard, completions) is not a file or a special file;
    - a fresh run finds no earlier run's checkpoints, metrics.jsonl, reward.png or completions logs there (it would
      replace them: they are continued with --resume);
    - out_dir/final_hf (with `train.export_hf`) and out_dir/final_adapter (a LoRA run exporting its adapter) are
      outputs (`check_output`): not a link or a file, not model.path (or inside it, or around it), and holding
      nothing from an earlier run unless resuming.
    """
    out = Path(cfg.train.out_dir)
    hint = "move it away, or choose another train.out_dir"
    entries = out_dir_entries(cfg)
    completions = out / "completions"
    logs = sorted(completions.glob(COMPLETIONS_LOG)) if completions.is_dir() and any(
        name == "completions" for name, _ in entries) else []
    for path, in_it in [(out / name, in_it) for name, in_it in entries] + [(log, None) for log in logs]:
        written = path.relative_to(out)
        refuse_special(path, f"train.out_dir's {written}", hint)
        if in_it is None and path.is_symlink():          # the log is appended through it: it would write elsewhere
            raise OutputError(f"train.out_dir's {written} {path} is a symbolic link; a run writes a file at it "
                              f"({hint})")
        if path.exists() and path.is_dir() != (in_it is not None):
            raise OutputError(f"train.out_dir's {written} {path} is {'not ' if in_it else ''}a directory; a run "
                              f"writes {in_it + ' in' if in_it else 'a file at'} it ({hint})")
    if not resume:
        refuse_fresh_run_over_checkpoints(out)            # the earlier run's checkpoints: the clearer refusal
        for path in [out / "metrics.jsonl", out / "reward.png", *logs]:
            if path.is_file() and (path.stat().st_size > 0 or path in logs):
                raise OutputError(f"train.out_dir {out} already holds {path.relative_to(out)}, which a fresh run "
                                  "would replace: pass --resume to continue that run, or choose another "
                                  "train.out_dir")
    lora = getattr(getattr(cfg, "grpo", None), "lora", None)
    exports = [name for name, wanted in (("final_hf", cfg.train.export_hf),
                                         ("final_adapter", lora is not None and lora.export != "merged")) if wanted]
    for name in exports:
        check_output(out / name, inputs=(cfg.model.path or None,), overwrite=resume, name=name,
                     overwrite_hint="continue that run with --resume")


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
    agent = build_agent(cfg.rollout, cfg.rewards, tools=tools, environment_factory=environment_factory,
                        rollout_func=rollout_func, owner=owner)
    try:
        return _train_export(cfg, algorithm_type, resume, allow_changes, agent, build_task=build_task, model=model,
                             tokenizer_dir=tokenizer_dir, observer=observer)
    finally:
        if agent is not None:
            agent.close()                       # the tools' worker processes


def run_rollout(cfg: Any, tokenizer: Any, model_cfg: Any, agent: Any) -> Rollout:
    """The run's one `Rollout`: its settings and seed, the tokenizer, the model's end-of-completion ids and the
    agent (tools, environments, a rollout_func; None: single-turn)."""
    return Rollout(cfg.rollout, tokenizer, eos_token_ids=tokenization.eos_token_ids(tokenizer, model_cfg.hf_config),
                   agent=agent, seed=cfg.train.seed)


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
    tok_dir = tokenizer_dir or ((cfg.model.path or None) if model is not None else    # a tokenizer given: that one
                                model_checkpoint.tokenizer_dir_of(cfg.model.path))
    tokenizer = tokenization.tokenizer_if_present(tok_dir, cfg.rollout.chat_template_kwargs)    # loaded once
    rollout = None if tokenizer is None or model_cfg is None else run_rollout(cfg, tokenizer, model_cfg, agent)
    reason = check_fits(cfg, algorithm_type, model_cfg, measured_prompt_tokens(cfg, task, rollout, model_cfg)
                        if rollout is not None else None)
    if reason:
        raise UserError(reason)
    if model is None:
        if not cfg.model.path:
            raise UserError("model.path is not set (an HF directory or a jaxcore checkpoint)")
        model, _ = model_checkpoint.load_any(cfg.model.path, cfg.model.dtype, remat=cfg.model.remat,
                                             **algorithm_type.load_targets(cfg))   # each weight into its shard
    if tok_dir is None:
        raise UserError(f"{cfg.model.path}: no tokenizer files")
    if rollout is None:        # no tokenizer files found before loading: loading them names the problem
        tokenizer = tokenization.with_chat_template_kwargs(tokenization.load_tokenizer(tok_dir),
                                                          cfg.rollout.chat_template_kwargs)
        rollout = run_rollout(cfg, tokenizer, model.config, agent)
    base_weights = weight_moments(model)          # before the algorithm owns (and updates) the weights
    try:
        algorithm = algorithm_type(model, tokenizer, cfg, eos_token_ids=rollout.eos_token_ids, rollout=rollout)
    except ValueError as err:
        raise UserError(str(err)) from err
    del model                                   # the algorithm owns the weights from here on
    summary = Runner(cfg, algorithm, task, base_weights=base_weights, observer=observer).run(
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
