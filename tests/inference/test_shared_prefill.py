"""A prompt sampled n times is prefilled once (issue 20, a rollout lever), guarded by counts, not clocks.

`generate(..., num_return_sequences=n)` runs the prefill over the distinct prompt rows and repeats the KV cache
and the last logits n times before the decode loop. XLA's own FLOP count of the prefill program that
generate() runs for 2 prompts x 8 samples must be that of 2 rows, not 16; the tokens and log-probs must be
those of the 16 repeated rows prefilled one by one (today's path), greedy and sampled with the same key, on one
device and with the rows sharded over a mesh. An EGGROLL population ties rows to members by position, so its
repeated rows are still prefilled row by row.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import jaxcore
from jaxcore.es import eggroll
from jaxcore.inference import generate as generate_module
from jaxcore.inference.generate import GenerationResult, generate
from jaxcore.parallel import meshes

PROMPTS, SAMPLES, NEW = 2, 8, 6


@pytest.fixture(scope="module")
def model(tiny_dir):
    return jaxcore.load_hf(tiny_dir("llama"))


def prompts(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompts of different lengths (3 to 9 tokens) in 9 columns."""
    rng = np.random.default_rng(seed)
    ids_BT = rng.integers(3, 200, (rows, 9)).astype(np.int32)
    mask_BT = (np.arange(9)[None] >= rng.integers(0, 7, rows)[:, None]).astype(np.int32)
    return np.where(mask_BT == 1, ids_BT, 0), mask_BT


def prefill_flops(monkeypatch: pytest.MonkeyPatch, model: Any, ids_BT: np.ndarray, mask_BT: np.ndarray, n: int
                  ) -> float:
    """XLA's FLOP count of the compiled prefill program that generate() runs for `n` samples per prompt."""
    calls: list[tuple[tuple, dict]] = []
    prefill = generate_module.prefill

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return prefill(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(generate_module, "prefill", recorded)
        generate(model, ids_BT, mask_BT, max_new_tokens=NEW, num_return_sequences=n, key=jax.random.key(0))
    assert len(calls) == 1, calls
    args, kwargs = calls[0]
    cost = prefill.lower(*args, **kwargs).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_a_prompt_sampled_n_times_is_prefilled_once(model, monkeypatch):
    """2 prompts x 8 samples: the prefill's FLOPs are those of the 2 distinct rows (within 1.05x), not 8x them."""
    ids_BT, mask_BT = prompts(PROMPTS)
    once = prefill_flops(monkeypatch, model, ids_BT, mask_BT, 1)
    shared = prefill_flops(monkeypatch, model, ids_BT, mask_BT, SAMPLES)
    assert once > 0
    assert shared / once <= 1.05, f"prefill of {PROMPTS} prompts x {SAMPLES}: {shared / once:.2f}x the FLOPs of 1"


def assert_same(shared: GenerationResult, rowwise: GenerationResult) -> None:
    """Identical tokens, lengths and stops; log-probs up to the float rounding of a prefill over fewer rows."""
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(rowwise.tokens))
    np.testing.assert_array_equal(np.asarray(shared.lengths), np.asarray(rowwise.lengths))
    np.testing.assert_array_equal(np.asarray(shared.finished), np.asarray(rowwise.finished))
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(rowwise.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=20)],
                         ids=["greedy", "sampled", "top_k"])
def test_the_shared_prefill_samples_what_repeated_rows_sample(model, sampling):
    """Same key: n samples per prompt give the tokens of the prompts repeated n times on the host (today's path)."""
    ids_BT, mask_BT = prompts(PROMPTS, seed=1)
    kw = dict(max_new_tokens=NEW, key=jax.random.key(3), eos_token_ids=(5,), **sampling)
    shared = generate(model, ids_BT, mask_BT, num_return_sequences=SAMPLES, **kw)
    rowwise = generate(model, np.repeat(ids_BT, SAMPLES, 0), np.repeat(mask_BT, SAMPLES, 0), **kw)
    assert shared.tokens.shape == (PROMPTS * SAMPLES, NEW)
    assert_same(shared, rowwise)
    if sampling["temperature"] > 0:      # the samples of a prompt differ: the key, not the cache, tells them apart
        assert len({tuple(row) for row in np.asarray(shared.tokens)[:SAMPLES]}) > 1


@pytest.mark.parametrize("prompts_n", [(8, 2), (2, 8)], ids=["prompts-divide-the-mesh", "fallback"])
def test_rows_sharded_over_a_mesh(model, prompts_n):
    """Rows over 8 devices: 8 prompts x 2 share their prefill with the distinct rows sharded like the repeated ones;
    2 prompts x 8 do not divide the mesh and are prefilled row by row. Both sample the unsharded tokens, and the
    rows stay where `row_sharding` puts them."""
    rows = meshes.leading_axis(meshes.grpo_mesh(1, jax.devices()[:8]), meshes.DATA)
    count, n = prompts_n
    ids_BT, mask_BT = prompts(count, seed=2)
    kw = dict(max_new_tokens=NEW, key=jax.random.key(4), temperature=1.0, num_return_sequences=n)
    sharded = generate(model, ids_BT, mask_BT, row_sharding=rows, **kw)
    assert_same(sharded, generate(model, ids_BT, mask_BT, **kw))
    assert sharded.tokens.sharding.is_equivalent_to(rows, 2), sharded.tokens.sharding


def test_a_population_keeps_its_rows_by_member(model):
    """4 members, 2 prompts x 2 samples: each member owns one of the 4 repeated rows, so a prompt's two samples
    belong to two members and cannot share a prefill; the result is that of the rows repeated on the host."""
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=4, rank=1, sigma=0.05))
    population = eggroll.population(model, plan, 0)
    ids_BT, mask_BT = prompts(2, seed=3)
    kw = dict(max_new_tokens=NEW, key=jax.random.key(5), temperature=1.0)
    shared = generate(population, ids_BT, mask_BT, num_return_sequences=2, **kw)
    assert_same(shared, generate(population, np.repeat(ids_BT, 2, 0), np.repeat(mask_BT, 2, 0), **kw))
