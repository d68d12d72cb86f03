"""Gemma 3 config.json parsing: transformers 4.x and 5.x layouts, the multimodal wrapper, bad values as one line."""

import pytest

from jaxcore.errors import ConfigError
from jaxcore.model.families import config_from_hf

# A transformers 4.x Gemma 3 text config (as the 4B model's text tower was published): global RoPE with linear
# scaling, the local base as rope_local_base_freq, the pattern as sliding_window_pattern, no layer_types.
LEGACY = {"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 16,
          "sliding_window_pattern": 3, "query_pre_attn_scalar": 32,
          "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None}


def test_legacy_layout():
    cfg = config_from_hf(LEGACY)
    assert cfg.family == "gemma3" and cfg.tie_word_embeddings and cfg.qk_norm and cfg.sandwich_norms
    assert [cfg.layer_window(i) for i in range(7)] == [16, 16, None, 16, 16, None, 16]
    assert cfg.layer_rope(2) == (1000000.0, {"rope_type": "linear", "factor": 8.0})
    assert cfg.layer_rope(0) == (10000.0, {})
    assert cfg.attention_scale == 32 ** -0.5 and cfg.embed_scale == 8.0


def test_legacy_layout_reads_as_transformers_reads_it():
    """transformers 5.x turns the 4.x keys into per-layer-type rope_parameters and layer_types; the config it
    writes back parses to the same ModelConfig (the saved JSON aside)."""
    from transformers import Gemma3TextConfig

    written = Gemma3TextConfig(**{k: v for k, v in LEGACY.items() if k != "model_type"}).to_dict()
    assert "layer_types" in written and "full_attention" in written["rope_parameters"]
    ours, theirs = config_from_hf(LEGACY), config_from_hf(written)
    assert ours.replace(hf_config_json="") == theirs.replace(hf_config_json="", max_position_embeddings=131072)


def test_multimodal_config_reads_its_text_tower():
    cfg = config_from_hf({"model_type": "gemma3", "text_config": dict(LEGACY)})
    assert cfg.family == "gemma3" and cfg.num_layers == 7 and cfg.hf_config["model_type"] == "gemma3_text"


@pytest.mark.parametrize("change, message", [
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention=true is not supported"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types must list 7"),
    (dict(layer_types=["local"] * 7), "layer_types must list 7"),
    (dict(hidden_activation="silu"), "unsupported hidden_activation 'silu' for gemma3"),
    (dict(sliding_window=0), "sliding_window must be >= 1"),
    (dict(model_type="gemma3"), "has no 'text_config'"),
])
def test_bad_values_are_one_line(change, message):
    with pytest.raises(ConfigError, match=message) as err:
        config_from_hf({**LEGACY, **change})
    assert "\n" not in str(err.value)


def test_roofline_counts_gemma3_270m_parameters():
    """The planner's parameter count of the 270M preset equals the parameters the model has (268.10M, as
    `jaxcore convert` reported for the real checkpoint)."""
    import jax

    from jaxcore.bench.roofline import Shape
    from jaxcore.hf.tiny import preset_config
    from jaxcore.model.transformer import abstract_model

    hf = preset_config("gemma3-270m")
    model = abstract_model(config_from_hf(hf))
    params = sum(x.size for x in jax.tree.leaves(model) if hasattr(x, "size"))
    assert Shape.from_hf(hf).total_params() == params == 268_098_176


@pytest.mark.parametrize("theta, head_dim", [(10000.0, 256), (1000000.0, 256), (100000.0, 64), (500000.0, 128)])
def test_rope_inverse_frequencies_are_transformers_bits(theta, head_dim):
    """HF's `1 / (base ** (arange(0, dim, 2) / dim))` in torch float32: at most one entry 1 ulp apart (torch's pow
    is not always correctly rounded). numpy's float32 pow, used before, was 1 ulp off in 5-26 entries of these,
    which the real Gemma 3 270M amplifies to 1e-2 in its logits past position 300."""
    import numpy as np
    import torch

    from jaxcore.model.rope import rope_inverse_frequencies

    cfg = config_from_hf({**LEGACY, "head_dim": head_dim, "rope_local_base_freq": theta})
    expected = (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))).numpy()
    ours = rope_inverse_frequencies(cfg, layer=0)
    assert ours.dtype == np.float32
    ulps = np.abs(ours.view(np.int32) - expected.view(np.int32))
    assert ulps.max() <= 1 and (ulps > 0).sum() <= 1
