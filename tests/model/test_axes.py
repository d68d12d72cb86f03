"""Every parameter's logical axes are declared by the layer that makes it (`jaxcore.model.axes`), for every
family and layout, and the placement rules read those names."""

import pytest

import jaxcore
from jaxcore.model import axes, parameters
from jaxcore.model.state import flat_state
from jaxcore.parallel import sharding

FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "gemma3")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_parameter_declares_its_axes(tiny_dir, family):
    model = jaxcore.load_hf(tiny_dir(family))
    declared, params = axes.logical_axes(model), flat_state(model)
    assert set(declared) == set(params)
    for path, value in params.items():
        assert len(declared[path]) == value.ndim, path
        assert parameters.parameter_axes(path) == declared[path], path


def test_the_tensor_parallel_layout_is_a_table_over_the_axes(tiny_dir):
    """A weight splits over the model axis exactly along its axis named in TENSOR_PARALLEL_AXES; norms,
    position tables and row-parallel biases stay whole."""
    model = jaxcore.load_hf(tiny_dir("gpt2"))
    for path, value in flat_state(model).items():
        spec = tuple(sharding.tensor_parallel_spec(path, tuple(value.shape), "model", 2))
        split = [name for name, entry in zip(parameters.parameter_axes(path), spec) if entry]
        expected = [name for name in parameters.parameter_axes(path) if name in sharding.TENSOR_PARALLEL_AXES]
        assert split == expected[:1], (path, spec)
    assert parameters.is_embedding("pos_embed.table") and parameters.is_embedding("embed.table")
    assert parameters.is_lm_head("lm_head.kernel") and not parameters.is_lm_head("blocks.0.mlp.down.kernel")
    assert parameters.parameter_axes("blocks.body.attn.q.kernel") == (axes.EMBED, axes.HEADS)   # the scanned layout
