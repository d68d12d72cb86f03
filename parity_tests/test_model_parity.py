"""jaxcore logits vs HF transformers on a left-padded batch, for every family."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from torchref.model import load_reference, reference_logits

FP32_ATOL = 1e-4
# bf16 compute (fp32 master weights, fp32 softmax/norms/RoPE) against the fp32 HF reference:
# max-abs logit error relative to the largest reference logit, measured ~1-2% on the tiny models.
BF16_REL_TOL = 0.05

CASES = [("llama", {}), ("llama", {"tie": True}), ("qwen2", {}), ("qwen2", {"tie": True}),
         ("qwen3", {}), ("qwen3", {"tie": False}), ("gpt2", {})]


def left_padded_batch(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of lengths 13, 9 and 4, left-padded with id 0."""
    rng = np.random.default_rng(seed)
    lengths = [13, 9, 4]
    ids = np.zeros((3, 13), np.int32)
    mask = np.zeros((3, 13), np.int32)
    for row, n in enumerate(lengths):
        ids[row, 13 - n:] = rng.integers(3, vocab, n)
        mask[row, 13 - n:] = 1
    return ids, mask


@pytest.mark.parametrize("family,options", CASES, ids=[f"{f}-{o}" for f, o in CASES])
def test_fp32_logits_match_transformers(tiny_dir, family, options):
    path = tiny_dir(family, **options)
    model = jaxcore.load_hf(path, dtype="float32")
    ids, mask = left_padded_batch(model.config.vocab_size)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = reference_logits(load_reference(path), ids, mask)
    assert ours.shape == ref.shape == (3, 13, model.config.vocab_size)
    err = np.abs(ours - ref)[mask == 1].max()
    print(f"{family} {options}: fp32 max-abs-diff {err:.2e}")
    assert err <= FP32_ATOL
    assert np.abs(ref).max() > 1.0   # the test model is not trivially near zero


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gpt2"])
def test_bf16_compute_within_tolerance(tiny_dir, family):
    path = tiny_dir(family)
    model = jaxcore.load_hf(path, dtype="bfloat16")
    assert model.embed.table.get_value().dtype == jnp.float32   # master weights stay fp32
    ids, mask = left_padded_batch(model.config.vocab_size, seed=1)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = reference_logits(load_reference(path), ids, mask)
    rel = np.abs(ours - ref)[mask == 1].max() / np.abs(ref).max()
    print(f"{family}: bf16 max-abs-diff / max|logit| = {rel:.3f}")
    assert rel <= BF16_REL_TOL
    assert (ours.argmax(-1) == ref.argmax(-1))[mask == 1].mean() >= 0.9
