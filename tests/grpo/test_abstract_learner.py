"""A GRPO learner made from `abstract_model` (shapes only) makes the same train step as one holding weights: how
the GPU compile checks build the step at sizes no host could hold (`jaxcore.bench.gpu_compile`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxcore
from jaxcore.bench import gpu_compile
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.model.transformer import abstract_model
from jaxcore.parallel import meshes


def test_an_abstract_learner_compiles_the_step_a_real_one_does(tiny_dir):
    model = jaxcore.load_hf(tiny_dir("llama"))
    mesh = meshes.grpo_mesh(2)
    work = gpu_compile.Workload(rows=16, prompt=8, new_tokens=8, dtype="float32")
    real = GRPOLearner(model, GRPOConfig(), mesh=mesh)
    shapes = GRPOLearner(abstract_model(model.config), GRPOConfig(), mesh=mesh)
    assert not any(isinstance(x, jax.Array) for x in jax.tree.leaves(shapes.state))       # nothing allocated
    assert jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), shapes.abstract_state) == jax.tree.map(
        lambda x: (x.shape, x.dtype, x.sharding), real.abstract_state)
    texts = [gpu_compile.lower_grpo_step(learner, work)[0].compile().as_text() for learner in (real, shapes)]
    assert texts[0] == texts[1]


def test_an_abstract_learner_has_no_reference_copy_to_make(tiny_dir):
    config = jaxcore.load_hf(tiny_dir("llama")).config
    cfg = GRPOConfig()
    cfg.grpo.beta = 0.04
    learner = GRPOLearner(abstract_model(config), cfg)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(learner.ref[1]))
    assert jax.tree.map(lambda x: x.dtype, learner.ref[1]) == jax.tree.map(lambda x: jnp.float32, learner.ref[1])
