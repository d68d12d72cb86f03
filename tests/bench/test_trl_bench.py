"""`jaxcore bench --suite trl`: TRL's own GRPOTrainer and jaxcore's, same model, prompts, reward and settings,
alternated; quick shapes on the tiny model (trl is part of the dev install, so this never skips)."""

import math

from jaxcore.bench import BenchOptions
from jaxcore.bench import trl as trl_bench
from jaxcore.runtime import compile_cache


def test_trl_suite_times_both_trainers_on_the_same_job(tmp_path, monkeypatch):
    """Both trainers on the same quick job, each run in its own process, timed and rewarded; the JSON says, per
    jaxcore run, which compilation cache served it and whether it was warm (here a fresh directory, given through
    the environment variable that overrides the tests' "off")."""
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "xla"))
    results = trl_bench.run(BenchOptions(quick=True, workdir=str(tmp_path)))
    key = "trl.short_4"
    assert results[f"{key}.trl_step_over_jax"] > 0
    for side in ("trl", "jax"):
        steps = results[f"{key}.{side}_step_s"]
        assert len(steps) == 1 and all(t > 0 for t in steps)            # 2 steps, the first left out
        rewards = results[f"{key}.{side}_reward"]
        assert len(rewards) == 2 and all(0.0 < r <= 1.0 and math.isfinite(r) for r in rewards)
    assert results["trl.device"]["versions"]["trl"] == "1.16.0"
    # each run a fresh process: TRL's with glibc's own allocator, jaxcore's with the policy its import sets
    assert results["trl.host_malloc"] == {"trl": "system", "jax": "kept"}
    (cache,) = results[f"{key}.jax_compilation_cache"]                  # one round, one jaxcore run
    assert cache["dir"] == str(tmp_path / "xla") and cache["warm"] is False and cache["entries_before"] == 0
    assert cache["hits"] == 0 and cache["misses"] >= 0


def test_brevity_is_a_trl_style_reward():
    assert trl_bench.brevity(["p", "q"], ["", "two words"]) == [1.0, 1.0 / 3.0]
    assert trl_bench.brevity(["p"], [[{"role": "assistant", "content": "two words"}]]) == [1.0 / 3.0]


def test_trl_suite_runs_conversational_prompts(tmp_path):
    """`--conversational`: both trainers get each prompt as a user message (through the chat template), under keys
    of their own."""
    results = trl_bench.run(BenchOptions(quick=True, workdir=str(tmp_path), conversational=True))
    assert results["trl.settings"]["prompts"][0] == [{"role": "user", "content": trl_bench.PROMPTS[0]}]
    for side in ("trl", "jax"):
        assert len(results[f"trl.chat_short_4.{side}_reward"]) == 2
