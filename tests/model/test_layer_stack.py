"""The two layouts of the blocks: a scanned model (`LayerStack`, one traced block under `lax.scan`) computes what
the per-layer model computes, for every family and for layers that differ (Gemma 3's sliding and global layers
in one scan), and the moves between the layouts lose nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore
from jaxcore.hf.tiny import write_tiny_checkpoint
from jaxcore.model import layer_stack
from jaxcore.model.state import flat_state, module_copy
from jaxcore.model.transformer import KVCache, layer_kinds
from tests.compile_log import CompiledPrograms, jax_compile_log

# Gemma 3 with sliding and global layers in the scanned body (layers 0-5) and a sliding last layer
GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def seven_layers(tmp_path_factory):
    """Seven-layer tiny checkpoints of every family (a scan of six layers, then the last)."""
    root = tmp_path_factory.mktemp("seven")

    def make(family: str):
        extra = {"layer_types": GEMMA_TYPES} if family == "gemma3" else {}
        return jaxcore.load_hf(write_tiny_checkpoint(root / family, family=family, preset="tiny", layers=7, **extra))
    return make


def _batch():
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 200, (3, 11)))
    return ids, jnp.ones_like(ids).at[0, :3].set(0)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "gemma3"])
def test_a_scanned_model_computes_the_per_layer_models_logits_and_gradients(seven_layers, family):
    model = seven_layers(family)
    if family == "gemma3":      # both kinds of layer inside the scan: the rope and mask are picked per layer
        assert len(set(layer_kinds(model.config)[:-1])) == 2
    scanned = layer_stack.scanned(model)
    assert scanned.scanned and not model.scanned
    ids, mask = _batch()
    for logits_from in (0, 5):
        np.testing.assert_allclose(np.asarray(scanned(ids, mask, logits_from=logits_from)),
                                   np.asarray(model(ids, mask, logits_from=logits_from)), rtol=1e-5, atol=2e-5)

    def loss(m):
        return jnp.sum(jax.nn.log_softmax(m(ids, mask, logits_from=5)) * 0.1)

    per_layer = nnx.to_pure_dict(nnx.grad(loss)(model))
    stacked = layer_stack.unstack_params(nnx.to_pure_dict(nnx.grad(loss)(scanned)))
    for a, b in zip(jax.tree.leaves(per_layer), jax.tree.leaves(stacked), strict=True):     # to 1e-5 of the largest
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4,
                                   atol=max(1e-5 * float(np.abs(a).max()), 1e-6))


def test_remat_and_the_moves_between_layouts(seven_layers):
    model = seven_layers("llama")
    model.remat = True
    scanned = layer_stack.scanned(model)
    ids, mask = _batch()
    np.testing.assert_allclose(np.asarray(scanned(ids, mask)), np.asarray(model(ids, mask)), rtol=1e-5, atol=2e-5)
    back = layer_stack.unrolled(scanned)
    assert not back.scanned
    for (path, a), (path_b, b) in zip(flat_state(model).items(), flat_state(back).items(), strict=True):
        assert path == path_b
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "blocks.body.attn.q.kernel" in flat_state(scanned) and "blocks.last.attn.q.kernel" in flat_state(scanned)
    assert flat_state(scanned)["blocks.body.attn.q.kernel"].shape[0] == 6
    with pytest.raises(TypeError, match="unrolled"):
        cache = KVCache.create(model.config, 3, 16, jnp.float32)
        scanned.forward_cached(ids, ids, mask.astype(bool), cache, jnp.int32(0))


def test_the_per_layer_view_is_one_program_whatever_the_depth_and_shapes(seven_layers):
    """The rollout takes the per-layer view of the trained weights every step: one compiled program slices every
    stacked parameter of every layer (not one program per parameter shape, run once per parameter and layer), and
    the next step's weights compile nothing more."""
    scanned = layer_stack.scanned(seven_layers("llama"))
    stepped = module_copy(scanned)
    nnx.update(stepped, jax.tree.map(lambda x: x * 2, nnx.state(stepped)))
    assert len({(x.shape, x.dtype) for x in jax.tree.leaves(nnx.state(scanned.blocks.body))}) > 1
    jax.clear_caches()
    compiled = CompiledPrograms()
    with jax_compile_log(compiled):
        views = [layer_stack.unrolled(scanned), layer_stack.unrolled(stepped)]
    assert len(compiled.names) == 1, compiled.names
    body = flat_state(scanned)["blocks.body.mlp.up.kernel"]
    for layer in range(6):
        for view, scale in zip(views, (1, 2), strict=True):
            np.testing.assert_array_equal(np.asarray(flat_state(view)[f"blocks.{layer}.mlp.up.kernel"]),
                                          np.asarray(body[layer]) * scale)


def test_parameter_trees_and_adapter_dicts_round_trip(seven_layers):
    model = seven_layers("llama")
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    stacked = layer_stack.stack_params(params)
    assert set(stacked["blocks"]) == {"body", "last"}
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(layer_stack.unstack_params(stacked)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # an optimizer state's moments move with the parameters they mirror; its counters stay
    state = optax.adam(1e-3).init(params)
    moved = layer_stack.map_like(layer_stack.stack_params, state, params)
    assert jax.tree.structure(moved[0].mu) == jax.tree.structure(stacked) and moved[0].count.shape == ()
    # AdamW's decay mask: a stacked norm scale [6, D] is a vector of its layer, a stacked kernel a matrix
    decays = layer_stack.layer_matrices(stacked)
    assert decays["blocks"]["body"]["attn_norm"]["scale"] is False and decays["blocks"]["body"]["attn"]["q"]["kernel"]
    adapters = {f"blocks.{i}.attn.q.kernel": {"a": jnp.full((4, 2), i), "b": jnp.full((2, 4), -i)} for i in range(7)}
    stacked_adapters = layer_stack.stack_paths(adapters, 7)
    assert set(stacked_adapters) == {"blocks.body.attn.q.kernel", "blocks.last.attn.q.kernel"}
    assert layer_stack.layer_matrices(stacked_adapters)["blocks.body.attn.q.kernel"]["a"]
    again = layer_stack.unstack_paths(stacked_adapters, 7)
    assert list(again) == list(adapters)
    for path in adapters:
        np.testing.assert_array_equal(np.asarray(again[path]["a"]), np.asarray(adapters[path]["a"]))
    with pytest.raises(ValueError, match="every layer"):
        layer_stack.stack_paths({k: v for k, v in adapters.items() if k != "blocks.3.attn.q.kernel"}, 7)
