"""The fused decode-step attention (`jaxcore.model.decode_attention`: RoPE, the cache write and attention in one
Pallas kernel) against the XLA path it replaces, run interpreted on the CPU (issue 48, item 2): the kernel's
outputs within 1e-6 in fp32, and on every family the same greedy tokens, including Gemma 3's sliding windows, an
EGGROLL population, and a kept multi-turn cache with invalid slots inside its rows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.es import eggroll
from jaxcore.inference.generate import generate, prefill
from jaxcore.model.decode_attention import BLOCK_S, chosen_path, fused_decode_attention
from jaxcore.model.rope import rotate
from jaxcore.model.transformer import grouped_attention

FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "gemma3")


def xla_path(q_BKGE, k_BKE, v_BKE, cos_BE, sin_BE, mask_BS, k_cache, v_cache, index, scale):
    """The decode step as `Attention.__call__` computes it without the kernel."""
    b, k, g, e = q_BKGE.shape
    q_B1HE, k_B1KE = q_BKGE.reshape(b, 1, k * g, e), k_BKE[:, None]
    if cos_BE is not None:
        rope = (cos_BE[:, None, None], sin_BE[:, None, None])
        q_B1HE, k_B1KE = rotate(q_B1HE, rope), rotate(k_B1KE, rope)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k_B1KE.transpose(0, 2, 3, 1).astype(k_cache.dtype),
                                           (0, 0, 0, index))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v_BKE[:, :, None].astype(v_cache.dtype), (0, 0, index, 0))
    out = grouped_attention(q_B1HE, k_cache.astype(q_BKGE.dtype), v_cache.astype(q_BKGE.dtype), mask_BS[:, None],
                            scale)
    return out.reshape(b, k, g, e), k_cache, v_cache


def inputs(dtype, b=3, k=2, g=3, e=16, s=2 * BLOCK_S + 7, rope=True, seed=0):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape), dtype)

    angles = rng.normal(size=(b, e // 2)) * 3
    angles = np.concatenate([angles, angles], -1)
    cos, sin = (jnp.asarray(f(angles), jnp.float32) for f in (np.cos, np.sin)) if rope else (None, None)
    mask = rng.random((b, s)) < 0.6
    mask[1] = False                    # a row that sees nothing: the XLA path averages every slot
    index = s - 5
    mask[0, index] = mask[2, index] = True
    return (normal(b, k, g, e), normal(b, k, e), normal(b, k, e), cos, sin, jnp.asarray(mask),
            normal(b, k, e, s), normal(b, k, s, e), index)


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "no-rope"])
def test_the_kernel_equals_the_xla_path_in_fp32(rope):
    args = inputs(jnp.float32, rope=rope)
    want = xla_path(*args, scale=0.3)
    got = fused_decode_attention(*args[:-1], jnp.int32(args[-1]), scale=0.3, interpret=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-6)


def test_the_kernel_in_bf16_rounds_as_the_xla_path_does():
    args = inputs(jnp.bfloat16, e=32, s=BLOCK_S)
    want = xla_path(*args, scale=0.2)
    got = fused_decode_attention(*args[:-1], jnp.int32(args[-1]), scale=0.2, interpret=True)
    for a, b in zip(got[1:], want[1:]):                     # the caches: the same bf16 values, but for a rounding
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32), atol=2e-2)


def test_heads_whose_width_is_not_a_power_of_two_keep_the_xla_path():
    from jaxcore.model.decode_attention import fits

    assert fits(16) and fits(64) and fits(128) and fits(256)
    assert not fits(80) and not fits(96) and not fits(8)


def test_auto_runs_the_xla_path_on_the_cpu_and_a_wrong_name_is_one_line(monkeypatch):
    assert chosen_path("auto") == "xla"
    with pytest.raises(ValueError, match="choose from auto, xla, pallas, pallas_interpret"):
        chosen_path("triton")
    monkeypatch.setenv("JAXCORE_DECODE_ATTENTION", "pallas")           # the command line's switch for "auto"
    assert chosen_path("auto") == "pallas" and chosen_path("xla") == "xla"
    monkeypatch.setenv("JAXCORE_DECODE_ATTENTION", "cuda")
    with pytest.raises(ValueError, match="JAXCORE_DECODE_ATTENTION='cuda'; choose from"):
        chosen_path("auto")


@jax.jit
def greedy_step(model, logits_BV, cache, position_B, index):
    """One greedy token through `forward_cached` (a jitted program per model structure: interpreting the kernel
    is traced once)."""
    token_B = jnp.argmax(logits_BV, -1).astype(jnp.int32)
    valid_B1 = jnp.ones_like(token_B, bool)[:, None]
    logits_B1V, cache = model.forward_cached(token_B[:, None], position_B[:, None], valid_B1, cache, index,
                                             last_only=True)
    return logits_B1V[:, 0], cache


def decode_logits(model, ids, mask, steps: int):
    """Logits of `steps` greedy decode steps after a prefill, each step through `forward_cached`."""
    logits, cache = prefill(model, ids, mask, cache_length=ids.shape[1] + steps)
    position = jnp.asarray(mask.sum(-1), jnp.int32)
    out = []
    for step in range(steps):
        logits, cache = greedy_step(model, logits, cache, position + step, jnp.int32(ids.shape[1] + step))
        out.append(logits)
    return np.stack(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_decodes_the_same_with_the_kernel(tiny_dir, family):
    model = jaxcore.load_hf(tiny_dir(family))
    ids = np.random.default_rng(1).integers(3, 200, (3, 8)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :3] = 0                                       # left padding
    plain = generate(model, ids, mask, max_new_tokens=12, temperature=0.0)
    model.use_decode_attention("pallas_interpret")
    fused = generate(model, ids, mask, max_new_tokens=12, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(fused.tokens), np.asarray(plain.tokens))
    np.testing.assert_allclose(np.asarray(fused.logprobs), np.asarray(plain.logprobs), atol=1e-5)


def test_gemma3_sliding_windows_pass_the_window_with_the_kernel(tiny_dir):
    """Tiny Gemma 3 alternates a 5-token sliding window with full attention: 20 new tokens run far past it."""
    model = jaxcore.load_hf(tiny_dir("gemma3"))
    assert model.config.sliding_window == 5
    ids = np.random.default_rng(2).integers(3, 200, (2, 6)).astype(np.int32)
    mask = np.ones_like(ids)
    want = decode_logits(model, ids, mask, 20)
    model.use_decode_attention("pallas_interpret")
    np.testing.assert_allclose(decode_logits(model, ids, mask, 20), want, atol=1e-5, rtol=1e-5)


def test_an_eggroll_population_decodes_the_same_with_the_kernel(tiny_dir):
    model = jaxcore.load_hf(tiny_dir("llama"))
    population = eggroll.population(model, eggroll.make_plan(model, eggroll.EggrollConfig(population=4, rank=1,
                                                                                            sigma=0.05)), 0)
    ids = np.random.default_rng(3).integers(3, 200, (4, 6)).astype(np.int32)
    want = generate(population, ids, np.ones_like(ids), max_new_tokens=10, temperature=0.0)
    population.use_decode_attention("pallas_interpret")
    got = generate(population, ids, np.ones_like(ids), max_new_tokens=10, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_kept_cache_with_holes_decodes_the_same_with_the_kernel(tiny_dir, family):
    """A multi-turn cache: a first turn, then an appended chunk whose rows hold invalid slots (its left padding
    and a finished row's), as `jaxcore.agents` keeps it; decode steps after it see only the valid slots."""
    model = jaxcore.load_hf(tiny_dir(family))
    rng = np.random.default_rng(4)
    ids = rng.integers(3, 200, (2, 6)).astype(np.int32)
    chunk = rng.integers(3, 200, (2, 4)).astype(np.int32)
    chunk_valid = np.array([[0, 0, 1, 1], [1, 0, 1, 1]], bool)           # holes inside the rows

    def run(path: str) -> np.ndarray:
        model.use_decode_attention(path)
        _, cache = prefill(model, ids, np.ones_like(ids), cache_length=6 + 4 + 8)
        positions = jnp.asarray(6 + np.cumsum(chunk_valid, -1) - 1, jnp.int32)
        logits, cache = model.forward_cached(jnp.asarray(chunk), positions, jnp.asarray(chunk_valid), cache,
                                             jnp.int32(6), last_only=True)
        out, position, logits = [], positions[:, -1] + 1, logits[:, -1]
        for step in range(8):
            logits, cache = greedy_step(model, logits, cache, position + step, jnp.int32(10 + step))
            out.append(np.asarray(logits))
        return np.stack(out)

    want = run("xla")
    np.testing.assert_allclose(run("pallas_interpret"), want, atol=1e-5, rtol=1e-5)


def test_the_kernel_is_one_program_per_decode_step_layer(tiny_dir):
    """Traced for the GPU path, a decode step holds one kernel call per layer and no XLA attention (no cache
    update or score product of its own)."""
    from flax import nnx

    from jaxcore.bench.gpu_compile import decode_step

    model = jaxcore.load_hf(tiny_dir("llama", layers=3)).use_decode_attention("pallas")
    ids = jnp.ones((4, 8), jnp.int32)
    _, cache = jax.eval_shape(functools.partial(prefill, cache_length=16), model, ids, ids)
    graphdef, state = nnx.split(model)
    zeros = jnp.zeros(4, jnp.int32)
    text = str(jax.make_jaxpr(decode_step.__wrapped__, static_argnums=0)(graphdef, state, cache, zeros, zeros,
                                                                        jnp.int32(8)))
    assert text.count("pallas_call") == 3
    assert text.count("dynamic_update_slice") == 2            # the step's valid and position slots, once
