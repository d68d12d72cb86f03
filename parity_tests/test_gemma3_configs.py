"""Gemma 3 shapes the tiny preset does not have, against transformers: other windows and local/global patterns,
head dims, GQA ratios, query scales, final-logit soft-capping on and off, tied and untied heads."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.inference.generate import generate
from parity_tests.batches import left_padded
from parity_tests.test_generate_parity import hf_greedy
from torchref.model import load_reference, reference_logits

FP32_ATOL = 1e-4
CONFIGS = {
    # multi-query attention, a window of 3, every third layer global, final logits capped at 5
    "mqa-window3-cap": dict(layers=3, heads=4, kv_heads=1, head_dim=16, sliding_window=3, layer_types=None, pattern=3,
                            final_logit_softcapping=5.0),
    # head_dim wider than hidden / heads, 4:1 GQA, a query scale of 100; attn_logit_softcapping set, which
    # transformers' Gemma 3 ignores (so must we); the global layers keep the default RoPE
    "gqa-wide-heads": dict(layers=4, heads=8, kv_heads=2, head_dim=24, sliding_window=7, layer_types=None, pattern=2,
                           query_pre_attn_scalar=100, attn_logit_softcapping=20.0, rope_scaling=None, tie=False),
    # every layer local with a window of 2 (each token sees itself and the one before). Not 1: transformers'
    # sliding-window cache keeps `[-window + 1:]` = `[-0:]`, everything, so its generate is wrong there
    "all-local-window2": dict(layers=2, sliding_window=2, layer_types=("sliding_attention",) * 2),
    # a window longer than every sequence, multi-head attention, final logits capped at 30
    "mha-long-window": dict(layers=2, heads=2, kv_heads=2, head_dim=32, sliding_window=100,
                            final_logit_softcapping=30.0, rope_local_theta=10000.0, rope_theta=1000000.0),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_unseen_gemma3_config_matches_transformers(tiny_dir, name):
    path = tiny_dir("gemma3", **CONFIGS[name])
    model = jaxcore.load_hf(path, dtype="float32")
    ids, mask = left_padded(model.config.vocab_size, (13, 9, 4))
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = reference_logits(load_reference(path), ids, mask)
    err = np.abs(ours - ref)[mask == 1].max()
    print(f"{name}: fp32 max-abs-diff {err:.2e}")
    assert err <= FP32_ATOL
    cap = model.config.final_logit_softcap
    assert cap is None or np.abs(ref).max() < cap
    ids, mask = left_padded(model.config.vocab_size, (12, 7, 3, 9), 0, np.int64)
    tokens = np.asarray(generate(model, ids, mask, max_new_tokens=24, temperature=0.0).tokens)
    np.testing.assert_array_equal(tokens, hf_greedy(path, ids, mask, 24))


def test_multimodal_checkpoint_loads_its_text_tower(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint (model_type gemma3, a tiny SigLIP tower beside the text model):
    jaxcore loads the text tower only, gives transformers' text logits, and exports a text-only Gemma 3 that
    transformers loads as Gemma3ForCausalLM with the same logits."""
    import torch
    import transformers

    from jaxcore.hf.tiny import _randomise, build_tokenizer, hf_config

    tokenizer = build_tokenizer(tmp_path / "mm")
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=hf_config("gemma3", vocab_size=len(tokenizer)).to_dict(),
                                       vision_config=vision.to_dict(), mm_tokens_per_image=4, image_token_index=258,
                                       boi_token_index=257, eoi_token_index=256)
    reference = transformers.Gemma3ForConditionalGeneration(config).float()
    _randomise(reference, 0, norm_offset=0.0)
    reference.save_pretrained(tmp_path / "mm")
    ids, mask = left_padded(256, (9, 6), 0, np.int64)
    with torch.no_grad():
        expected = reference.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    model = jaxcore.load_hf(tmp_path / "mm")
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert np.abs(ours - expected)[mask == 1].max() <= FP32_ATOL
    exported = transformers.AutoModelForCausalLM.from_pretrained(jaxcore.save_hf(model, tmp_path / "out"),
                                                                 dtype=torch.float32)
    assert type(exported).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        again = exported(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    assert np.abs(again - expected)[mask == 1].max() <= FP32_ATOL
