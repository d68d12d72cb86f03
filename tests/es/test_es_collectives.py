"""What the ES update sends between devices, counted in its compiled programs on 8 simulated devices (issue
41, item 4): with the masters split over (pop, model) the update moves no weight between devices; its
collectives carry scalars (the finiteness check) or noise factors, each smaller than the smallest weight
matrix. The fitness itself is gathered on the host, once per epoch (`parallel.rows.allgather_sum`)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hlo_collectives import collectives, largest

import jaxcore
from jaxcore.es import eggroll


@pytest.mark.parametrize("model_axis", [1, 2])
def test_the_es_update_moves_no_weight_between_devices(tiny_dir, model_axis):
    from jaxcore.config.yaml_config import load_config
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.es.config import ESConfig
    from jaxcore.hf.tokenization import load_tokenizer

    path = tiny_dir("llama", kv_heads=4)              # every kernel splits over the 8 devices
    cfg = load_config(ESConfig, None, [f"model.path={path}", "es.population=16", f"mesh.model={model_axis}",
                                       "mesh.shard_min_size=1"])
    algorithm = EggrollAlgorithm(jaxcore.load_hf(path), load_tokenizer(path), cfg)
    params = eggroll.perturbed_params(algorithm.model, algorithm.plan)
    assert any(any(v.sharding.spec) for v in params.values())     # the masters are split
    shardings = tuple((k, v.sharding) for k, v in params.items())
    fitness_N = jnp.asarray(np.linspace(-1, 1, 16), jnp.float32)
    gradient = collectives(eggroll._gradient_drawing_slices.lower(
        algorithm.plan, jnp.int32(0), fitness_N, shardings).compile().as_text())
    update = collectives(eggroll.apply_update.lower(params, algorithm.opt_state, params, algorithm.optimizer)
                         .compile().as_text())
    smallest_matrix = min(math.prod(v.shape) for v in params.values() if v.ndim == 2)
    assert largest(gradient) < smallest_matrix, (largest(gradient), smallest_matrix)
    assert set(update) <= {"all-reduce"} and largest(update) == 1         # the finiteness check: one scalar
