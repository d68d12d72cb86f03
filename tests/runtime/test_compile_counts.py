"""Speed guarded by counts, not clocks: whole runs compile their programs once (issue 20, item 4c).

An epoch after the first must reuse the programs the first one compiled: an ES run compiles nothing after
its first epoch (the population, the update and the generation have one shape per run), and a GRPO run whose
completion lengths vary compiles only for a completion-length bucket it has not seen before, a bounded
number of programs per new bucket (the train step and the forwards that score the bucket), never one per
length. Compilations are counted from JAX's own compile log (`jax_log_compiles`), each attributed to the
epoch during which it happened.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcore.cli import main
from jaxcore.grpo import algorithm as grpo_algorithm
from jaxcore.grpo.algorithm import GRPOAlgorithm
from jaxcore.grpo.buckets import completion_buckets, completion_width
from jaxcore.inference.generate import GenerationResult
from jaxcore.runtime import compile_cache
from jaxcore.runtime import metrics as metrics_module
from jaxcore.runtime import runner as runner_module
from jaxcore.runtime.programs import ledger
from jaxcore.runtime.rollout import Rollout
from tests.cli_runs import es_args, grpo_args, phases_within
from tests.compile_log import COMPILED, jax_compile_log

EPOCHS = 5


class _CompileLog(logging.Handler):
    """Records (epoch being run, program name) for every XLA compilation."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.epoch = 0                  # epochs logged so far: compilations now belong to epoch `epoch + 1`
        self.saving: int | None = None  # the number of the checkpoint save under way (1 = the run's first)
        self.saves = 0
        self.events: list[tuple[int, str]] = []
        self.save_events: list[tuple[int, str]] = []
        self.logged: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = COMPILED.search(record.getMessage())
        if match and self.saving is not None:
            self.save_events.append((self.saving, match.group(1)))
        elif match:
            self.events.append((self.epoch, match.group(1)))

    def after_first_epoch(self) -> list[tuple[int, str]]:
        """Compilations during epochs 2..EPOCHS (the last epoch's evaluation and export excluded)."""
        return [(epoch, name) for epoch, name in self.events if 1 <= epoch < EPOCHS]

    def after_first_save(self) -> list[tuple[int, str]]:
        """Compilations during checkpoint saves after the first (which gathers each array's shards once)."""
        return [(save, name) for save, name in self.save_events if save > 1]


@contextmanager
def compile_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[_CompileLog]:
    log = _CompileLog()
    original = metrics_module.MetricsLogger.log

    def log_and_count(self, step: int, metrics: dict) -> None:
        original(self, step, metrics)
        if step > 0:                       # step 0 is the evaluation before training
            log.epoch = step
            log.logged.append(dict(metrics))

    original_save = runner_module.Runner._save

    def save_and_count(self, epoch: int, **kwargs) -> None:
        log.saves += 1
        log.saving = log.saves
        try:
            original_save(self, epoch, **kwargs)
        finally:
            log.saving = None

    monkeypatch.setattr(metrics_module.MetricsLogger, "log", log_and_count)
    monkeypatch.setattr(runner_module.Runner, "_save", save_and_count)
    with jax_compile_log(log):
        yield log


def test_an_es_run_compiles_nothing_after_its_first_epoch(tiny_dir, tmp_path, monkeypatch, capsys):
    """Five ES epochs, each with new prompts and noise: every program is compiled in the first. Each epoch's
    metrics split its time into rollout, scoring, update and making programs (all of it in the first epoch), and
    the last line says when the first step ended and how long the run waited for programs."""
    with compile_log(monkeypatch) as log:
        code = main(["es", *es_args(tiny_dir("llama"), tmp_path / "es", f"train.epochs={EPOCHS}",
                                    "train.eval_every=-1", "train.checkpoint_every=1")])
    assert code == 0
    assert len(log.logged) == EPOCHS
    assert [name for epoch, name in log.events if epoch == 0], "the first epoch compiled nothing: not counting?"
    assert log.after_first_epoch() == []
    assert log.saves == EPOCHS and log.after_first_save() == []
    for epoch, m in enumerate(log.logged):
        parts = m["timing/rollout"] + m["timing/scoring"] + m["timing/update"] + m["timing/compile"]
        assert phases_within(parts, m["step_time"]), (parts, m["step_time"])
        assert (m["timing/compile"] > 0 and m["compile/programs"] > 0) if epoch == 0 else m["compile/programs"] == 0
    assert 0 < log.logged[0]["run_time"] < log.logged[-1]["run_time"]
    assert re.search(r"first step \d+\.\d s after start, \d+\.\d s making programs\)$", capsys.readouterr().out.strip())


def test_a_grpo_run_makes_its_train_step_programs_beside_its_first_rollout(tiny_dir, tmp_path, monkeypatch):
    """Five GRPO epochs whose longest completions are 3, 5, 2, 9 and 4 tokens (max_new_tokens 16; a tiny random
    model rarely samples EOS, so each epoch's sampled completions are cut to that length, as an EOS would), with
    prompts of several widths: the train-step programs of every (prompt width, completion bucket) the epochs can
    meet are queued before the first rollout (the runner shows the algorithm the epochs to come) and made on the
    background thread: at most the planned number, each once, and none of them, nor any scoring forward, is made
    in a later epoch (the first epoch waits for the queue here, so that the count does not depend on the
    machine's speed). On the code before, each new bucket compiled its step when first met, in its epoch. (On the
    CPU backend of a small host only the likeliest is made ahead: `spare_host_cores`.)"""
    max_new, longest = 16, (3, 5, 2, 9, 4)
    sample, make_batch, train_step = Rollout.generate, GRPOAlgorithm.make_batch, GRPOAlgorithm.train_step
    shapes: list[tuple[int, int]] = []       # (prompt columns, completion columns) of each epoch's train step
    ends: list[float] = []
    rollouts: list[int] = []                 # one generation per epoch (no evaluation)

    def make_batch_seen(self, *args, **kwargs):
        batch = make_batch(self, *args, **kwargs)
        prompt = batch.completion_start + 1
        shapes.append((prompt, batch.input_ids_BT.shape[1] - prompt))
        return batch

    def rollout_cut(self, *args, **kwargs) -> GenerationResult:
        epoch = len(rollouts)
        rollouts.append(epoch)
        result = sample(self, *args, **kwargs)
        lengths_B = jnp.minimum(result.lengths, longest[epoch])
        kept_BN = jnp.arange(result.tokens.shape[1])[None] < lengths_B[:, None]
        return GenerationResult(jnp.where(kept_BN, result.tokens, self.tokenizer.pad_token_id),
                                jnp.where(kept_BN, result.logprobs, 0.0), lengths_B,
                                result.finished | (result.lengths > lengths_B))

    def train_step_then_drain(self, epoch, examples, scorer):
        result = train_step(self, epoch, examples, scorer)
        if epoch == 0:
            self.ahead.drain()
        ends.append(time.time())
        return result

    monkeypatch.setattr(Rollout, "generate", rollout_cut)
    monkeypatch.setattr(GRPOAlgorithm, "make_batch", make_batch_seen)
    monkeypatch.setattr(GRPOAlgorithm, "train_step", train_step_then_drain)
    monkeypatch.setattr(grpo_algorithm, "spare_host_cores", lambda: True)       # as on an accelerator's host
    began = time.time()
    code = main(["grpo", *grpo_args(tiny_dir("llama"), tmp_path / "grpo", f"train.epochs={EPOCHS}",
                                    f"rollout.max_new_tokens={max_new}", "rollout.temperature=1.0",
                                    "train.eval_every=-1", "train.checkpoint_every=1", "grpo.beta=0.04")])
    assert code == 0 and len(ends) == EPOCHS
    widths = [completion_width(np.array([n]), max_new) for n in longest]
    assert widths == [4, 8, 2, 16, 4] == [c for _, c in shapes]
    prompts = {p for p, _ in shapes}
    spans = [s for s in ledger().spans if s.start >= began and s.stage == "compile"]
    steps = [s for s in spans if s.name == "jit(step)"]
    assert steps and all(s.end <= ends[0] for s in steps), "a train step was made after the first epoch"
    assert len(steps) <= len(prompts) * len(completion_buckets(max_new)), (len(steps), prompts)
    later = [s.name for s in spans if s.start > ends[0] and s.name in ("jit(step)", "jit(_score_fn)")]
    assert later == []


CACHE_LINE = re.compile(r"compilation cache (\S+): (\d+) programs loaded, (\d+) written")


def test_a_rerun_loads_its_programs_from_the_compilation_cache(tiny_dir, tmp_path):
    """Two processes run the same one-epoch `jaxcore grpo` job with `--compilation-cache DIR`: the first compiles
    and writes every program to DIR, the second loads every one of them from it and compiles nothing (counted by
    JAX's own cache events). JAX writes only programs that took `jax_persistent_cache_min_compile_time_secs`
    to compile (default 1 s); the tiny model's take less, so the threshold is 0 here."""
    cache = tmp_path / "xla"
    env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}      # the tests' "off" would win
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    counts = []
    for run in ("first", "second"):
        args = grpo_args(tiny_dir("llama"), tmp_path / run, "train.epochs=1", "train.eval_every=-1",
                         "train.export_hf=false")
        done = subprocess.run([sys.executable, "-m", "jaxcore.cli", "grpo", "--compilation-cache", str(cache), *args],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found = CACHE_LINE.findall(done.stderr)
        assert len(found) == 1 and found[0][0] == str(cache), done.stderr[-2000:]
        counts.append((int(found[0][1]), int(found[0][2])))
    (loaded_1, written_1), (loaded_2, written_2) = counts
    assert loaded_1 == 0 and written_1 > 0
    assert compile_cache.entries(str(cache)) == written_1
    assert (loaded_2, written_2) == (written_1, 0)


def test_a_cache_that_cannot_be_written_reports_nothing_written(monkeypatch, tmp_path, caplog):
    """A program whose cache entry could not be written (a read-only directory: JAX warns and goes on) is not
    reported as written (before: every program JAX offered to the cache was counted as "written")."""
    from jax._src import lru_cache

    def read_only(self, key, value):
        raise PermissionError("read-only file system")

    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.setattr(lru_cache.LRUCache, "put", read_only)
    try:
        compile_cache.enable(str(tmp_path / "xla"))
        with pytest.warns(UserWarning, match="Error writing persistent compilation cache entry"):
            jax.jit(lambda x: x * 7 + 2)(jnp.ones(3)).block_until_ready()
        with caplog.at_level(logging.INFO, logger=compile_cache.__name__):
            compile_cache.log_stats()
        stats = compile_cache.stats()
        assert stats["misses"] > 0 and stats["written"] == 0 == compile_cache.entries(str(tmp_path / "xla"))
        assert f"0 written ({stats['misses']} compiled programs could not be written)" in caplog.text
    finally:
        compile_cache.enable("off")


def test_the_cache_setting(monkeypatch, tmp_path):
    """The environment variable overrides the setting; "off" turns the cache off; the default directory is under
    ~/.cache/jaxcore unless JAX was given one (the tests' environment turns the cache off)."""
    assert compile_cache.resolve(str(tmp_path)) is None                  # the tests' JAXCORE_COMPILATION_CACHE=off
    monkeypatch.delenv(compile_cache.ENV)
    assert compile_cache.enable("off") is None and not jax.config.jax_compilation_cache_dir
    assert compile_cache.resolve(str(tmp_path)) == str(tmp_path)
    assert compile_cache.resolve("off") is None
    assert compile_cache.resolve(None) == os.path.expanduser("~/.cache/jaxcore/xla")
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))     # as JAX_COMPILATION_CACHE_DIR would
    try:
        assert compile_cache.resolve(None) == str(tmp_path / "jax")
        assert compile_cache.resolve(str(tmp_path)) == str(tmp_path)
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
    assert compile_cache.resolve("off") == str(tmp_path / "env")
