"""Sampling frequencies match the exactly filtered distribution (transformers' warpers, in order)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jaxpr_walk import all_eqns
from scipy import stats
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import jaxcore
from jaxcore.inference.generate import generate
from jaxcore.inference.sampling import (
    ARGMAX_CHUNK,
    SamplingConfig,
    filter_logits,
    first_argmax,
    inverse_cdf_draw,
    sample_next,
)

DRAWS = 40_000
LOGITS = np.array([2.0, 1.6, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0], np.float32)
SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=5),
    SamplingConfig(temperature=1.5, top_p=0.8),
    SamplingConfig(temperature=2.0, min_p=0.3),
    SamplingConfig(temperature=2.0, top_k=7, top_p=0.8, min_p=0.3),
]


def hf_distribution(logits: np.ndarray, cfg: SamplingConfig, order=("temperature", "top_k", "top_p", "min_p")):
    """The exactly filtered distribution, computed with transformers' own warpers."""
    make = {"temperature": lambda: TemperatureLogitsWarper(cfg.temperature) if cfg.temperature != 1 else None,
            "top_k": lambda: TopKLogitsWarper(cfg.top_k) if cfg.top_k else None,
            "top_p": lambda: TopPLogitsWarper(cfg.top_p) if cfg.top_p < 1 else None,
            "min_p": lambda: MinPLogitsWarper(cfg.min_p) if cfg.min_p > 0 else None}
    warpers = LogitsProcessorList([w for w in (make[name]() for name in order) if w is not None])
    scores = warpers(torch.zeros(1, 1, dtype=torch.long), torch.tensor(logits)[None])
    return torch.softmax(scores, -1)[0].double().numpy()


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0                                    # sampled a token the filter removes
    expected = probs[support] / probs[support].sum() * counts.sum()
    return stats.chisquare(counts[support], expected).pvalue


def draw(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    keys = jax.random.split(jax.random.key(0), DRAWS)
    tokens = jax.jit(jax.vmap(lambda k: sample_next(jnp.asarray(logits)[None], k, cfg)[0]))(keys)
    return np.bincount(np.asarray(tokens), minlength=len(logits))


@pytest.mark.parametrize("cfg", SETTINGS, ids=str)
def test_frequencies_match_filtered_distribution(cfg):
    probs = hf_distribution(LOGITS, cfg)
    ours = np.asarray(jax.nn.softmax(filter_logits(jnp.asarray(LOGITS)[None], cfg)))[0]
    np.testing.assert_allclose(ours, probs, atol=1e-6)
    assert chi_square_pvalue(draw(LOGITS, cfg), probs) > 1e-3


def test_wrong_filter_order_is_detected():
    """The check has power: every order that changes the distribution is rejected by the samples."""
    cfg = SETTINGS[-1]
    counts = draw(LOGITS, cfg)
    right = hf_distribution(LOGITS, cfg)
    distinct = 0
    for order in itertools.permutations(("temperature", "top_k", "top_p", "min_p")):
        wrong = hf_distribution(LOGITS, cfg, order=order)
        if np.abs(wrong - right).max() > 0.05:
            distinct += 1
            assert chi_square_pvalue(counts, wrong) < 1e-6, order
    assert distinct >= 20


def test_greedy_is_argmax():
    assert int(sample_next(jnp.asarray(LOGITS)[None], jax.random.key(0), SamplingConfig(temperature=0.0))[0]) == 0


@pytest.mark.parametrize("vocab", [7, 256, 257, 49152])
def test_first_argmax_equals_argmax_with_ties_nan_and_infinities(vocab):
    rng = np.random.default_rng(vocab)
    x = rng.normal(size=(9, vocab)).astype(np.float32)
    x[1] = 0.0                                                  # all tied: the first
    x[2, rng.integers(vocab, size=3)] = x[2].max() + 1          # tied maxima in different chunks: the first
    x[3] = -np.inf
    x[4, -1] = np.inf
    x[5, [vocab // 2, vocab - 1]] = np.nan                      # NaN wins, the first one
    x[6, 0] = np.nan
    x[7] = np.round(x[7])                                       # many ties
    np.testing.assert_array_equal(first_argmax(jnp.asarray(x)), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(first_argmax(jnp.asarray(x, jnp.bfloat16)),
                                  jnp.argmax(jnp.asarray(x, jnp.bfloat16), axis=-1))


@pytest.mark.parametrize("cfg", SETTINGS[:3], ids=str)
def test_sampling_inverts_the_filtered_cumulative_distribution(cfg):
    """Each draw is the token whose interval of the filtered distribution's (float64) cumulative sum holds the row's
    uniform number, up to float32 rounding of the sums."""
    logits = np.random.default_rng(1).normal(size=(6, 1000)).astype(np.float32)
    probs_RV = np.stack([hf_distribution(row, cfg) for row in logits])
    upper_RV = np.cumsum(probs_RV, axis=-1)
    rows = np.arange(len(logits))
    for seed in range(5):
        key = jax.random.key(seed)
        uniform_R = np.asarray(jax.random.uniform(key, (len(logits),)), np.float64)
        tokens_R = np.asarray(sample_next(jnp.asarray(logits), key, cfg))
        assert (probs_RV[rows, tokens_R] > 0).all()
        assert (upper_RV[rows, tokens_R] - probs_RV[rows, tokens_R] <= uniform_R + 1e-6).all()
        assert (uniform_R < upper_RV[rows, tokens_R] + 1e-6).all()


def test_frequencies_match_across_chunks():
    """Over a vocabulary of several chunks (the draw first picks a chunk of `ARGMAX_CHUNK` tokens, then a token in
    it), the frequencies still follow the distribution, and the tokens a filter removed are never drawn."""
    logits = np.random.default_rng(2).normal(scale=1.5, size=3 * ARGMAX_CHUNK + 40).astype(np.float32)
    cfg = SamplingConfig(temperature=1.0, top_k=200)
    assert chi_square_pvalue(draw(logits, cfg), hf_distribution(logits, cfg)) > 1e-3


@pytest.mark.parametrize("vocab", [7, 256, 257, 49152])
def test_inverse_cdf_draw_at_the_ends_of_the_unit_interval(vocab):
    """At uniform numbers 0 and just below 1 (where rounding of the float32 sums may pass every token), the draw is
    the first, respectively the last, token of nonzero probability: never a removed (-inf) token, never past the
    vocabulary (its chunks' padding)."""
    rng = np.random.default_rng(vocab)
    scores_RV = np.full((5, vocab), -np.inf, np.float32)
    scores_RV[0] = rng.normal(size=vocab)                          # every token
    scores_RV[1, 0] = 0.0                                          # the first only
    scores_RV[2, -1] = 0.0                                         # the last only
    scores_RV[3, [1, vocab // 2]] = [3.0, -3.0]                    # two, in different chunks when vocab > 256
    scores_RV[4, : min(vocab, 5)] = 20.0                           # large and equal, the rest removed
    first = [0, 0, vocab - 1, 1, 0]
    last = [vocab - 1, 0, vocab - 1, vocab // 2, min(vocab, 5) - 1]
    for uniform, expected in ((0.0, first), (float(np.nextafter(np.float32(1), np.float32(0))), last)):
        tokens_R = inverse_cdf_draw(jnp.asarray(scores_RV), jnp.full((5,), uniform, jnp.float32))
        np.testing.assert_array_equal(tokens_R, expected)


def test_a_temperature_near_zero_draws_among_the_largest_logits():
    """The two largest logits over a temperature of 1e-37 overflow to +inf, the others stay finite; the draw is one
    of the two (exp(inf - inf) would make every weight NaN and draw token 0)."""
    logits = np.array([[0.5, 40.0, -1.0, 40.0, 2.0]], np.float32)
    cfg = SamplingConfig(temperature=1e-37)
    tokens = {int(sample_next(jnp.asarray(logits), jax.random.key(seed), cfg)[0]) for seed in range(40)}
    assert tokens == {1, 3}


def test_sampling_draws_one_uniform_number_per_row():
    """The Gumbel-max draw (`jax.random.categorical`) made one random number per row and vocabulary entry: 4.2 ms
    of a ~70 ms decode step over SmolLM2's 49,152 logits at 16 rows (16 ms at 64) on two CPU cores. Count, not
    clock: the sampler's random bits are one word per row."""
    rows = 16
    jaxpr = jax.make_jaxpr(lambda x: sample_next(x, jax.random.key(0), SamplingConfig(temperature=0.7, top_p=0.9)))(
        jnp.zeros((rows, 49152), jnp.float32))
    drawn = sum(int(np.prod(eqn.outvars[0].aval.shape)) for eqn in all_eqns(jaxpr.jaxpr)
                if eqn.primitive.name in ("random_bits", "threefry2x32"))
    assert 0 < drawn <= rows, drawn


def test_greedy_sampling_reduces_no_long_axis_as_argmax():
    """argmax compiles on XLA:CPU to a (value, index) reduction that does not vectorise: over SmolLM2's 49,152
    logits at 60 rows it took 4.3 ms of a ~107 ms decode step (0.7-0.9 ms in chunks). Count, not clock: no argmax in
    the sampler reduces more than one chunk's worth of entries."""
    jaxpr = jax.make_jaxpr(lambda x: sample_next(x, jax.random.key(0), SamplingConfig(temperature=0.0)))(
        jnp.zeros((60, 49152), jnp.float32))
    reduced = [eqn.invars[0].aval.shape[eqn.params["axes"][0]] for eqn in jaxpr.jaxpr.eqns
               if eqn.primitive.name == "argmax"]
    assert reduced and max(reduced) <= ARGMAX_CHUNK, reduced


def test_generate_first_token_frequencies(tiny_dir):
    """End to end through generate(): the first sampled token follows the filtered model distribution."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    ids = np.array([[7, 8, 9, 10]], np.int32)
    mask = np.ones_like(ids)
    cfg = SamplingConfig(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05)
    logits = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))[0, -1]
    probs = hf_distribution(logits, cfg)
    result = generate(model, ids, mask, max_new_tokens=1, num_return_sequences=4000, key=jax.random.key(3),
                      temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p)
    counts = np.bincount(np.asarray(result.tokens)[:, 0], minlength=len(logits))
    assert chi_square_pvalue(counts, probs) > 1e-3
