"""ES on a (pop, model) mesh: sharded masters, tensor-parallel compute weights, same parameters."""

import jax
import numpy as np
import pytest

import jaxcore
from jaxcore import eggroll, sharding
from jaxcore.convert import flat_state
from jaxcore.es_trainer import compute_model, init_opt_state, shard_masters
from jaxcore.generate import generate


def train_two_epochs(path, devices, model_size: int):
    model = jaxcore.load_hf(path)
    mesh = sharding.es_mesh(model_size, devices)
    shard_masters(model, mesh, min_size=1)         # tiny weights: shard them all
    rows = sharding.leading_axis(mesh, sharding.POP)
    cfg = eggroll.EggrollConfig(population=16, rank=2, sigma=0.05, seed=1)
    plan = eggroll.make_plan(model, cfg)
    optimizer = eggroll.make_optimizer("sgd", 0.025)
    opt_state = init_opt_state(optimizer, eggroll.perturbed_params(model, plan), mesh, min_size=1)
    rng = np.random.default_rng(0)
    ids = np.repeat(rng.integers(3, 200, (2, 6)), 16, axis=0)      # 16 members x 2 prompts
    mask = np.ones_like(ids)
    for epoch in range(2):
        compute = compute_model(model, mesh)
        pop = eggroll.population(compute, plan, epoch, out_sharding=rows)
        result = generate(pop, ids, mask, max_new_tokens=3, temperature=0.0, row_sharding=rows)
        fitness = np.asarray(result.logprobs).reshape(16, -1).mean(1)
        opt_state, _ = eggroll.es_step(model, plan, optimizer, opt_state, epoch, fitness, donate_params=True)
    return model, compute


@pytest.fixture(scope="module")
def reference(tiny_dir):
    path = tiny_dir("llama")
    model, _ = train_two_epochs(path, jax.devices()[:1], 1)
    return path, {k: np.asarray(v) for k, v in flat_state(model).items()}


@pytest.mark.parametrize("model_size", [1, 2, 4])
def test_mesh_shapes_give_the_same_parameters(reference, model_size):
    path, one = reference
    model, compute = train_two_epochs(path, jax.devices(), model_size)
    start = {k: np.asarray(v) for k, v in flat_state(jaxcore.load_hf(path)).items()}
    assert any(not np.array_equal(one[k], start[k]) for k in one)
    for key, value in flat_state(model).items():
        np.testing.assert_allclose(one[key], np.asarray(value), atol=1e-6, rtol=0, err_msg=key)
    master = flat_state(model)["blocks.0.mlp.up.kernel"]
    assert master.addressable_shards[0].data.size == master.size // 8          # each device: 1/8 of the master
    blocks = [v for k, v in flat_state(compute).items() if k.startswith("blocks.")]
    compute_bytes = sum(v.addressable_shards[0].data.nbytes for v in blocks)     # one device's share
    replicated_bytes = sum(v.nbytes for v in blocks)
    kernels = [v for k, v in flat_state(compute).items() if k.startswith("blocks.") and k.endswith("kernel")]
    assert all(k.addressable_shards[0].data.size == k.size // model_size for k in kernels)
    if model_size == 4:   # per-device block weights about a quarter (norms replicated)
        assert compute_bytes < 0.3 * replicated_bytes, (compute_bytes, replicated_bytes)


def test_resume_on_a_different_mesh_shape(tiny_dir, tmp_path):
    """A checkpoint of (pop=8, model=1)-sharded masters and Adam state restores onto (pop=2, model=4)."""
    from jaxcore.checkpoint import TrainCheckpointer

    def sharded_state(model_size: int):
        model = jaxcore.load_hf(tiny_dir("llama"))
        mesh = sharding.es_mesh(model_size)
        shard_masters(model, mesh, min_size=1)
        plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=16))
        optimizer = eggroll.make_optimizer("adam", 1e-3)
        params = eggroll.perturbed_params(model, plan)
        opt_state = init_opt_state(optimizer, params, mesh, min_size=1)
        opt_state, _ = eggroll.es_step(model, plan, optimizer, opt_state, 0, np.arange(16.0))
        return {"params": flat_state(model), "opt_state": opt_state}

    saved = sharded_state(1)
    checkpointer = TrainCheckpointer(tmp_path / "ckpt", async_save=False)
    checkpointer.save(1, saved, {"epoch": 1}, wait=True)
    target = sharded_state(4)
    target = jax.tree.map(lambda x: x * 0, target)
    restored, _ = checkpointer.restore(target)
    checkpointer.close()
    for a, b, t in zip(jax.tree.leaves(saved), jax.tree.leaves(restored), jax.tree.leaves(target)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert b.sharding == t.sharding
