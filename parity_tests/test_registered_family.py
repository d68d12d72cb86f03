"""A model family registered from this file alone, touching no library module (docs/porting-a-family.md):
Mistral, the Llama-style decoder under its own model_type, converts, runs, generates, exports and is equal to
transformers."""

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcore
from jaxcore.errors import ConfigError
from jaxcore.hf.convert import read_safetensors, save_hf
from jaxcore.hf.tiny import write_tiny_checkpoint
from jaxcore.inference.generate import generate
from jaxcore.model import families
from jaxcore.model.config import ModelConfig
from jaxcore.model.families.base import (
    DECODER_KEYS,
    Family,
    OptionalSize,
    decoder_config,
    decoder_tensors,
    decoder_tiny_settings,
    default_rope,
)
from parity_tests.batches import left_padded
from torchref.model import load_reference, reference_logits


def parse(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("sliding_window") is not None:
        raise ConfigError(f"mistral: sliding_window={hf['sliding_window']} is not supported here")
    return decoder_config(hf, "mistral")


def tiny_config(p: dict[str, Any], vocab_size: int, tie: bool, ids: dict[str, int]) -> Any:
    import transformers

    return transformers.MistralConfig(**decoder_tiny_settings(p, vocab_size, tie, ids),
                                      head_dim=p["hidden"] // p["heads"], sliding_window=None,
                                      rope_parameters=default_rope(p))


MISTRAL = Family("mistral", ("mistral",), parse, decoder_tensors, {**DECODER_KEYS, "sliding_window": OptionalSize},
                 tiny_config)


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    families.register_family(MISTRAL)
    try:
        yield write_tiny_checkpoint(tmp_path_factory.mktemp("mistral"), "mistral")
    finally:
        families.registered().pop("mistral")


def test_a_registered_family_matches_transformers(mistral_dir):
    model = jaxcore.load_hf(mistral_dir, dtype="float32")
    assert model.config.family == "mistral"
    ids, mask = left_padded(model.config.vocab_size, (13, 9, 4))
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    reference = load_reference(mistral_dir)
    assert type(reference).__name__ == "MistralForCausalLM"
    ref = reference_logits(reference, ids, mask)
    assert np.abs(ours - ref)[mask == 1].max() <= 1e-4 and np.abs(ref).max() > 1.0

    greedy = np.asarray(generate(model, ids, mask, max_new_tokens=8, temperature=0.0).tokens)
    with torch.no_grad():
        hf = reference.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                                max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    np.testing.assert_array_equal(greedy, hf[:, ids.shape[1]:].numpy())


def test_a_registered_family_exports_what_it_read(mistral_dir, tmp_path):
    exported = save_hf(jaxcore.load_hf(mistral_dir), tmp_path / "out", tokenizer_dir=mistral_dir)
    original, written = read_safetensors(mistral_dir), read_safetensors(exported)
    assert set(original) == set(written)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_a_registered_family_refuses_what_it_does_not_support(mistral_dir, tmp_path):
    from jaxcore.hf.convert import read_json_config

    hf = read_json_config(mistral_dir / "config.json")
    with pytest.raises(ConfigError, match="sliding_window=4096 is not supported"):
        families.config_from_hf({**hf, "sliding_window": 4096})
    with pytest.raises(ValueError, match="already family 'mistral'"):
        families.register_family(Family("other", ("mistral",), parse, decoder_tensors, {}, tiny_config))
