"""`flat_state` and `module_copy` read and copy a model through its pytree structure: the same entries in the same
order as flax's graph traversal (`nnx.state`, `nnx.split` / `nnx.merge`) on every family, a LoRA model and an
EGGROLL population, and the ES epoch never walks the module graph (generate's jitted programs take the model as a
pytree too).
(flax's graph traversal took 12-19 ms per read of SmolLM2-135M's 272 parameters, and the ES epoch read or copied
the model five times: ~100 ms of host time per epoch while the device waited.)"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

import jaxcore
from jaxcore.model.state import flat_state, module_copy, variable_at


def graph_flat_state(model: nnx.Module) -> dict[str, Any]:
    """The parameters by dotted path as flax's graph traversal lists them (what `flat_state` used to do)."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(nnx.to_pure_dict(nnx.state(model, nnx.Param)), "")
    return flat


def assert_same_entries(model: nnx.Module) -> None:
    ours, graph = flat_state(model), graph_flat_state(model)
    assert list(ours) == list(graph)
    for path in graph:          # a stand-in (LoRA, a population member's noise) is rebuilt over the same arrays
        assert jax.tree.structure(ours[path]) == jax.tree.structure(graph[path])
        assert all(a is b for a, b in zip(jax.tree.leaves(ours[path]), jax.tree.leaves(graph[path])))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gpt2", "gemma3"])
def test_flat_state_lists_what_the_graph_traversal_lists(tiny_dir, family):
    assert_same_entries(jaxcore.load_hf(tiny_dir(family)))


def test_flat_state_of_a_lora_model_and_a_population_holds_their_stand_ins(tiny_dir):
    from jaxcore.es import eggroll
    from jaxcore.es.config import EggrollConfig
    from jaxcore.model import lora

    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = lora.LoRAConfig(rank=2)
    adapters = lora.init_adapters(model, ["blocks.0.attn.q.kernel", "blocks.1.mlp.up.kernel"], cfg,
                                  jax.random.key(0))
    with_lora = lora.lora_model(model, adapters, cfg)
    assert isinstance(flat_state(with_lora)["blocks.0.attn.q.kernel"], lora.LoRAKernel)
    assert_same_entries(with_lora)

    population = eggroll.population(model, eggroll.make_plan(model, EggrollConfig(population=4, rank=1)), 0)
    assert type(flat_state(population)["blocks.1.mlp.up.kernel"]).__name__ == "LowRankPerturbed"
    assert_same_entries(population)


def test_module_copy_has_fresh_variables_over_the_same_arrays(tiny_dir):
    model = jaxcore.load_hf(tiny_dir("llama"))
    copy = module_copy(model)
    assert nnx.graphdef(copy) == nnx.graphdef(model)
    assert all(copy_value is value for copy_value, value in zip(flat_state(copy).values(), flat_state(model).values()))
    before = flat_state(model)["blocks.0.attn.q.kernel"]
    variable_at(copy, "blocks.0.attn.q.kernel").set_value(before + 1.0)
    assert flat_state(model)["blocks.0.attn.q.kernel"] is before
    np.testing.assert_array_equal(np.asarray(flat_state(copy)["blocks.0.attn.q.kernel"]), np.asarray(before) + 1.0)


def test_an_es_epoch_never_walks_the_module_graph(tiny_dir, monkeypatch):
    """Reading the parameters (compute weights, the update), copying the model (compute weights, the population)
    and passing it to generate's jitted prefill and decode all go through its pytree structure. Before, the epoch
    traversed the graph five times (`nnx.state` twice, `nnx.split` three times)."""
    from flax.nnx import graphlib

    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.es.config import EggrollConfig, ESConfig
    from jaxcore.hf.tokenization import load_tokenizer
    from jaxcore.rewards import Scorer
    from jaxcore.rewards.tasks import addition_task

    path = tiny_dir("llama")
    cfg = ESConfig(es=EggrollConfig(population=8, rank=1))
    cfg.rollout.max_new_tokens, cfg.rollout.prompts_per_epoch = 2, 1
    algorithm = EggrollAlgorithm(jaxcore.load_hf(path), load_tokenizer(path), cfg)
    task = addition_task(digits=1)
    scorer = Scorer(task.reward_fns, task.reward_weights, num_workers=0)
    examples = task.examples("train", 1, seed=0)
    algorithm.train_step(0, examples, scorer)                  # compiles
    walks = []
    original = graphlib.flatten
    monkeypatch.setattr(graphlib, "flatten", lambda *a, **k: walks.append(1) or original(*a, **k))
    algorithm.train_step(1, examples, scorer)
    scorer.close()
    assert not walks
