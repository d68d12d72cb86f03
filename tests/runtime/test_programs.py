"""Making programs, counted apart from running them (`jaxcore.runtime.programs`), and programs made ahead of need
on a background thread: a train step made ahead makes nothing when it runs."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.bench.grpo import synthetic_batch
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.model import lora
from jaxcore.runtime.programs import AheadOfTime, PhaseClock, ledger


def fresh_program(seed: float):
    """A jitted function no earlier call made (a new constant: a new program)."""
    return jax.jit(lambda x: jnp.sin(x * seed) @ x.T)


def test_a_phase_counts_its_own_work_apart_from_making_programs():
    x = jnp.ones((64, 64))
    clock = PhaseClock()
    began = time.perf_counter()
    with clock.phase("work"):
        fresh_program(1.25)(x).block_until_ready()         # traced, lowered and compiled here
        time.sleep(0.2)
    wall = time.perf_counter() - began
    metrics = clock.metrics()
    assert metrics["timing/compile"] > 0 and metrics["compile/programs"] >= 1 and metrics["compile/trace_s"] > 0
    assert 0.2 <= metrics["timing/work"] < 0.2 + (wall - metrics["timing/compile"])
    assert metrics["timing/work"] + metrics["timing/compile"] == pytest.approx(wall, abs=0.05)
    with clock.phase("again"):
        fresh_program(1.25)                                  # nothing made: a new function object, not called
    assert clock.metrics()["compile/programs"] == metrics["compile/programs"]


def test_programs_made_on_another_thread_are_not_this_threads_compile_time():
    x = jnp.ones((32, 32))
    clock = PhaseClock()
    with clock.phase("work"):
        thread = threading.Thread(target=lambda: fresh_program(2.5)(x).block_until_ready())
        thread.start()
        thread.join()
    metrics = clock.metrics()
    assert metrics["compile/programs"] == 0 and metrics["timing/compile"] == 0.0
    assert metrics["compile/ahead_programs"] >= 1 and metrics["compile/ahead_s"] > 0
    assert ledger().totals(clock.began).programs >= 1          # any thread


def test_ahead_of_time_runs_in_order_and_a_wait_takes_a_queued_job_itself():
    ahead, ran, gate, started = AheadOfTime(), [], threading.Event(), threading.Event()
    ahead.submit("first", lambda: (started.set(), gate.wait(), ran.append(("first", threading.current_thread().name))))
    started.wait()                       # the thread is making "first"
    ahead.submit("second", lambda: ran.append(("second", threading.current_thread().name)))
    assert not ahead.submit("second", lambda: ran.append("twice"))           # once per key
    ahead.wait("never submitted")                                            # nothing to wait for
    ahead.wait("second")                 # queued behind a job that waits: this thread makes it now
    assert ran == [("second", threading.current_thread().name)]
    gate.set()
    ahead.wait("first")
    assert ran[1] == ("first", "jaxcore-ahead-of-time") and ahead.pending() == 0
    ahead.submit("failing", lambda: 1 / 0)
    ahead.wait("failing")                                                    # logged; the real call reports
    gate.clear()
    ahead.submit("blocking", gate.wait)
    ahead.submit("dropped", lambda: ran.append("dropped"))
    gate.set()
    ahead.close()
    assert "dropped" not in ran or ran[-1] == "dropped"
    assert not ahead.submit("after close", lambda: None)


@pytest.mark.parametrize("options", [{}, {"beta": 0.04}, {"num_iterations": 2},
                                     {"lora": lora.LoRAConfig(rank=2, dropout=0.1)}, {"scan": False},
                                     {"fsdp": 2}], ids=["plain", "beta", "mu2", "lora", "per-layer", "fsdp2"])
def test_a_train_step_made_ahead_makes_nothing_when_it_runs(path, batch, grpo_job, options):
    """`make_programs` for a rollout's shape (on a background thread) leaves nothing for training on it to make:
    no trace, no lowering, no compilation, whatever the options (scoring forwards, LoRA, layout, mesh)."""
    from jaxcore.parallel.meshes import grpo_mesh

    options = dict(options)
    scan, fsdp = options.pop("scan", True), options.pop("fsdp", 1)
    cfg = grpo_job(loss_type="dapo", learning_rate=1e-2, max_completion_length=8, generations_per_prompt=4,
                   **options)
    cfg.model.scan_layers = scan
    batch = synthetic_batch(jaxcore.load_hf(path).config.vocab_size, 8, 6, 8, group_size=4, seed=1,
                            shared_prompts=True)           # a rollout's groups: packed, each prompt once
    learner = GRPOLearner(jaxcore.load_hf(path), cfg, mesh=grpo_mesh(fsdp) if fsdp > 1 else None,
                          **({"fsdp_min_size": 1024} if fsdp > 1 else {}))
    rows, prompt = np.shape(batch.advantages_B)[0], batch.completion_start + 1
    thread = threading.Thread(target=learner.make_programs,
                              args=(rows, prompt, batch.input_ids_BT.shape[1] - prompt, False))
    thread.start()
    thread.join()
    since = time.time()
    learner.train_on_rollout(batch)
    assert ledger().names("trace", since) == [] and ledger().names("compile", since) == []
