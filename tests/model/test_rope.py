"""Rotary tables: computed once per forward and position, not once per layer, head and pass.

XLA:CPU fused cos and sin of the angles into every layer's rotation of q and k, forward and backward, and evaluated
them there once per element (an optimisation barrier around shared tables does not stop it: XLA:CPU removes it).
The compiled training forward + backward then spent a fifth of its transcendental functions on RoPE (24.9 million
against the 20.8 million its softmax and SiLU need, bench model, 8 x 127 tokens). Computed once per position and
gathered, the rotation costs no transcendental beyond one [T, E] table of cos and sin."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcore
from jaxcore.model.rope import rope_tables
from jaxcore.model.transformer import layer_kinds


def test_gathered_tables_equal_the_direct_ones():
    positions_BT = jnp.asarray(np.maximum(np.arange(24)[None] - np.array([[0], [5], [23]]), 0))
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    for direct, gathered in zip(rope_tables(positions_BT, inv_freq), rope_tables(positions_BT, inv_freq, 24)):
        assert direct.shape == gathered.shape == (3, 24, 1, 16)
        np.testing.assert_array_equal(np.asarray(direct), np.asarray(gathered))


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_training_forward_and_backward_evaluate_no_transcendental_per_head(tiny_dir, family):
    """The compiled forward + backward's transcendental functions (XLA's count) are the softmax's exponentials and
    the activation's (SiLU's sigmoid; Gemma's tanh GELU), one rsqrt per normalised row, the logits' log-sum-exp and
    one rotary table per RoPE base: nothing per head."""
    model = jaxcore.load_hf(tiny_dir(family))
    cfg = model.config
    b, t = 4, 32
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids_BT = jnp.ones((b, t), jnp.int32)

    def loss(params):
        logits_BTV = nnx.merge(graphdef, params, rest)(ids_BT, attention_mask=jnp.ones((b, t), bool))
        return jnp.sum(jax.nn.log_softmax(logits_BTV)[..., 0])

    cost = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
    transcendentals = float((cost[0] if isinstance(cost, list) else cost)["transcendentals"])
    softmax = cfg.num_layers * b * cfg.num_heads * t * t
    activation = cfg.num_layers * b * t * cfg.intermediate_size
    norm_rows = (cfg.num_layers * (4 + 2 * cfg.qk_norm * (cfg.num_heads + cfg.num_kv_heads)) + 1) * b * t
    log_softmax = b * t * cfg.vocab_size
    tables = 2 * t * cfg.head_dim * len({freqs for _, freqs in layer_kinds(cfg)})
    essential = softmax + activation + norm_rows + log_softmax + tables
    per_head = 2 * cfg.num_layers * b * t * (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim   # one pass of cos
    assert transcendentals <= essential + per_head / 4, (transcendentals, essential, per_head)


def test_a_decode_step_over_a_long_cache_computes_no_table_of_every_slot(tiny_dir):
    """One row decoding one token over 4096 cache slots: the table of every slot (2 x 4096 x E cos and sin) would
    cost far more than the row's own angles, so the step computes those directly."""
    from jaxcore.model.transformer import KVCache

    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg, slots = model.config, 4096
    cache = KVCache.create(cfg, 1, slots, jnp.float32)
    one = jnp.ones((1, 1), jnp.int32)

    def step(model, cache):
        return model.forward_cached(one, one, one.astype(bool), cache, jnp.int32(1), last_only=True)[0]

    cost = jax.jit(step).lower(model, cache).compile().cost_analysis()
    transcendentals = float((cost[0] if isinstance(cost, list) else cost)["transcendentals"])
    softmax = cfg.num_layers * cfg.num_heads * slots
    assert transcendentals < softmax + slots * cfg.head_dim, (transcendentals, softmax)


ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}


@pytest.mark.parametrize("layout", ["rope_scaling", "rope_parameters"])       # transformers 4's, and 5's
@pytest.mark.parametrize("edit, message", [
    ({"drop": "low_freq_factor"}, "config.json's rope_scaling (llama3) is missing 'low_freq_factor' (transformers has "
                                  "no default for it): add it"),
    ({"drop": "original_max_position_embeddings"}, "is missing 'original_max_position_embeddings'"),
    ({"factor": "8"}, "config.json's rope_scaling (llama3): 'factor' is '8'; expected a positive number"),
    ({"high_freq_factor": 1.0}, "low_freq_factor 1.0 must be below high_freq_factor 1.0"),
    ({"rope_type": "linear", "drop": "factor"}, "config.json's rope_scaling (linear) is missing 'factor'"),
])
def test_a_rope_scaling_missing_a_key_is_refused_where_it_is_read(tiny_dir, tmp_path, capsys, edit, message, layout):
    """issue 51: a llama3 rope_scaling without low_freq_factor was accepted by convert, then generate failed with
    "unexpected KeyError". transformers has no default for these keys, so convert and every load refuse it in one
    line naming the key."""
    import json
    import shutil

    from tests.cli_runs import run_cli

    model = shutil.copytree(tiny_dir("llama"), tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    scaling = {**ROPE_SCALING, **{k: v for k, v in edit.items() if k != "drop"}}
    scaling.pop(edit.get("drop"), None)
    config.pop("rope_parameters", None)
    config[layout] = {**scaling, "rope_theta": 10000.0} if layout == "rope_parameters" else scaling
    message = message.replace("rope_scaling", layout)
    (model / "config.json").write_text(json.dumps(config))
    for command in (["convert", "--from-hf", model, "--out", tmp_path / "converted"],
                    ["generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2"]):
        code, err = run_cli(capsys, *command)
        assert code == 2 and len(err) == 1 and message in err[0], (command[0], err)
    assert not (tmp_path / "converted").exists()
