"""ES on a (pop, model) mesh: sharded masters, tensor-parallel compute weights, same parameters."""

import jax
import numpy as np
import pytest

import jaxcore
from jaxcore.es import eggroll
from jaxcore.es.algorithm import compute_model, init_opt_state, shard_masters
from jaxcore.es.population import LowRankPerturbed
from jaxcore.inference.generate import generate
from jaxcore.model.state import flat_state, variable_at
from jaxcore.parallel import meshes, sharding
from jaxcore.runtime.optim import OptimizerConfig, make_optimizer


def train_two_epochs(path, devices, model_size: int):
    model = jaxcore.load_hf(path)
    mesh = meshes.es_mesh(model_size, devices)
    shard_masters(model, mesh, min_size=1)         # tiny weights: shard them all
    rows = meshes.leading_axis(mesh, meshes.POP)
    cfg = eggroll.EggrollConfig(population=16, rank=2, sigma=0.05, seed=1)
    plan = eggroll.make_plan(model, cfg)
    optimizer = make_optimizer(OptimizerConfig("sgd"), learning_rate=0.025)
    opt_state = init_opt_state(optimizer, eggroll.perturbed_params(model, plan), mesh)
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
    path = tiny_dir("llama", kv_heads=4)      # whole heads on each of 4 devices: every kernel splits
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
    """A checkpoint of masters and Adam state sharded 1/8 over (pop=8, model=1) restores onto
    (pop=1, model=4) over 4 devices: every sharded leaf really changes layout (1/8 -> 1/4 slices)."""
    from jaxcore.runtime.checkpoint import TrainCheckpointer

    def sharded_state(model_size: int, devices):
        model = jaxcore.load_hf(tiny_dir("llama"))
        mesh = meshes.es_mesh(model_size, devices)
        shard_masters(model, mesh, min_size=1)
        plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=16))
        optimizer = make_optimizer(OptimizerConfig("adam"), learning_rate=1e-3)
        params = eggroll.perturbed_params(model, plan)
        opt_state = init_opt_state(optimizer, params, mesh)
        opt_state, _ = eggroll.es_step(model, plan, optimizer, opt_state, 0, np.arange(16.0))
        return {"params": flat_state(model), "opt_state": opt_state}

    saved = sharded_state(1, jax.devices())
    checkpointer = TrainCheckpointer(tmp_path / "ckpt", async_save=False)
    checkpointer.save(1, saved, {"epoch": 1}, wait=True)
    target = sharded_state(4, jax.devices()[:4])
    target = jax.tree.map(lambda x: x * 0, target)
    restored, _ = checkpointer.restore(target)
    checkpointer.close()
    resharded = 0
    for a, b, t in zip(jax.tree.leaves(saved), jax.tree.leaves(restored), jax.tree.leaves(target)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert b.sharding == t.sharding
        if a.ndim == 2:
            assert a.addressable_shards[0].data.size == a.size // 8
            assert b.addressable_shards[0].data.size == b.size // 4 and len(b.sharding.device_set) == 4
            resharded += 1
    assert resharded >= 14          # masters and both Adam moments of the 2 layers' matrices


# ----------------------------------------------------------------------------- factors and evaluation


def test_factors_are_sharded_like_their_weight(tiny_dir):
    """On (pop=2, model=4): A [P, I, r] is split like W's input dim, B [P, O, r] like its output dim,
    and the pairs over "pop" (column-parallel q/k/v/gate/up split B, row-parallel o/down split A)."""
    model = jaxcore.load_hf(tiny_dir("llama", kv_heads=4))     # 4 kv heads: k/v split by heads over 4 devices
    mesh = meshes.es_mesh(4)
    rows = meshes.leading_axis(mesh, meshes.POP)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=16, rank=2))
    pop = eggroll.population(compute_model(model, mesh), plan, 0, out_sharding=rows)
    kinds = set()
    for target in plan.targets:
        value = variable_at(pop, target.path).get_value()
        assert isinstance(value, LowRankPerturbed), target.path
        (i, o), pairs = target.shape, 8
        module = target.path.split(".")[-2]
        w_in, w_out = ((1, 4) if module in ("q", "k", "v", "gate", "up") else (4, 1) if module in ("o", "down")
                       else (None, None))
        assert w_in is not None, target.path
        kinds.add((w_in, w_out))
        assert value.w.addressable_shards[0].data.shape == (i // w_in, o // w_out), target.path
        assert value.a.addressable_shards[0].data.shape == (pairs // 2, i // w_in, 2), target.path
        assert value.b.addressable_shards[0].data.shape == (pairs // 2, o // w_out, 2), target.path
        a_spec, b_spec = tuple(value.a.sharding.spec) + (None,) * 3, tuple(value.b.sharding.spec) + (None,) * 3
        w_spec = tuple(value.w.sharding.spec) + (None,) * 2
        assert (a_spec[:2], b_spec[:2]) == ((meshes.POP, w_spec[0]), (meshes.POP, w_spec[1])), target.path
    assert kinds == {(1, 4), (4, 1)}


def test_prefill_on_the_mesh_holds_a_quarter_of_each_weight(tiny_dir):
    """The prefill that evaluation and rollouts compile on (pop=2, model=4): every weight argument is a
    quarter per device (XLA's own argument bytes ~1/4 of the replicated weights), and no collective
    gathers a weight: every all-gather is of per-row activations or KV cache (a head count that does not
    divide by the model axis keeps its projections whole: `test_tensor_parallel_attention_splits_only_between_
    whole_heads`)."""
    import re

    from jaxcore.inference.generate import prefill

    model = jaxcore.load_hf(tiny_dir("llama", tie=True, kv_heads=4))   # tied: no [H, 259] lm_head (259 % 4)
    mesh = meshes.es_mesh(4)
    compute = compute_model(model, mesh)
    rows = meshes.leading_axis(mesh, meshes.POP)
    ids = sharding.put_global(np.ones((10, 16), np.int32), rows)       # 5 rows per pop device
    compiled = prefill.lower(compute, ids, ids, cache_length=24).compile()
    weights = {k: v for k, v in flat_state(compute).items() if v.ndim == 2}
    specs = jax.tree.leaves(compiled.input_shardings[0][0])
    assert len(specs) == len(jax.tree.leaves(compute))
    for leaf, arg_sharding in zip(jax.tree.leaves(compute), specs):
        if leaf.ndim == 2:
            shard = arg_sharding.shard_shape(leaf.shape)
            assert np.prod(shard) == leaf.size // 4, (leaf.shape, shard)
    replicated_bytes = sum(v.nbytes for v in jax.tree.leaves(compute))
    argument_bytes = compiled.memory_analysis().argument_size_in_bytes
    print(f"prefill arguments per device {argument_bytes} B vs replicated weights {replicated_bytes} B "
          f"({argument_bytes / replicated_bytes:.3f})")
    assert argument_bytes < 0.3 * replicated_bytes
    gathered = re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", compiled.as_text())
    assert gathered, "expected XLA to gather activations"
    # rows first ([5 rows, ...], or [5 x 16 positions, features] as the linear layers flatten them): no weight
    assert all(shape.split(",")[0] in ("5", str(5 * 16)) for shape in gathered), gathered
    assert len(weights) == 2 * 7 + 1


# ----------------------------------------------------------------------------- the trainer on the mesh

CLI_RUN = ["task.name=addition", "task.options.digit_match_weight=1.0", "rollout.temperature=1.0",
           "rollout.prompts_per_epoch=2", "rollout.max_new_tokens=3", "es.population=16", "es.rank=2",
           "optimizer.learning_rate=0.05", "optimizer.momentum=0.9", "train.eval_prompts=5", "train.eval_every=-1",
           "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false"]


def es_cli(model, out, *extra, resume: bool = False) -> int:
    from jaxcore.cli import main

    flags = ["--resume"] if resume else []
    return main(["es", *flags, f"model.path={model}", f"train.out_dir={out}", *CLI_RUN, *map(str, extra)])


@pytest.fixture
def recorded(monkeypatch):
    """The ES algorithms the trainer builds, and the weights every evaluation's (greedy) `sample` receives."""
    from jaxcore.api import ESTrainer
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.runtime.rollout import Rollout

    seen = {"algorithms": [], "eval_weights": []}
    real_sample = Rollout.generate

    class Recorded(EggrollAlgorithm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["algorithms"].append(self)

    def sample(rollout, model, *args, **kwargs):
        if kwargs["key"] is None:           # greedy: an evaluation's
            seen["eval_weights"].append({k: v for k, v in flat_state(model).items() if v.ndim == 2})
        return real_sample(rollout, model, *args, **kwargs)

    monkeypatch.setattr(ESTrainer, "algorithm_type", staticmethod(lambda cfg: Recorded))
    monkeypatch.setattr(Rollout, "generate", sample)
    return seen


def per_device_fraction(x: jax.Array) -> float:
    return x.addressable_shards[0].data.size / x.size


@pytest.fixture(scope="module")
def cli_runs(tiny_dir, tmp_path_factory):
    """A straight 4-epoch run and a 2-epoch run to resume from, both on (pop=8, model=1) with the default
    mesh.shard_min_size (every tiny weight stays replicated)."""
    from jaxcore.hf.convert import read_safetensors

    model, root = tiny_dir("llama", kv_heads=4), tmp_path_factory.mktemp("cli")   # every kernel splits 4 ways
    assert es_cli(model, root / "straight", "train.epochs=4") == 0
    assert es_cli(model, root / "half", "train.epochs=2") == 0
    return model, root, read_safetensors(root / "straight" / "final_hf")


def assert_same_final(straight: dict, out, model) -> None:
    from jaxcore.hf.convert import read_safetensors

    resumed, start = read_safetensors(out / "final_hf"), read_safetensors(model)
    assert any(not np.array_equal(straight[k], start[k]) for k in straight)
    for key in straight:
        np.testing.assert_allclose(resumed[key], straight[key], atol=1e-6, rtol=0, err_msg=key)


def test_cli_resume_reshards_onto_another_mesh(cli_runs, tmp_path, recorded):
    """`jaxcore es --resume` with mesh.model=4 and mesh.shard_min_size=1 (both harmless changes): the
    replicated (8, 1) checkpoint is restored as 1/8 master and momentum slices on (pop=2, model=4),
    evaluation runs on tensor-parallel compute weights (a quarter per device), and epochs 2-3 give the
    straight run's parameters."""
    import shutil

    model, root, straight = cli_runs
    out = tmp_path / "resumed"
    shutil.copytree(root / "half", out)
    assert es_cli(model, out, "train.epochs=4", "mesh.model=4", "mesh.shard_min_size=1", "train.eval_every=4",
                  resume=True) == 0
    assert_same_final(straight, out, model)
    (algorithm,) = recorded["algorithms"]
    assert dict(algorithm.mesh.shape) == {"pop": 2, "model": 4}
    masters = eggroll.perturbed_params(algorithm.model, algorithm.plan)
    momentum = [x for x in jax.tree.leaves(algorithm.opt_state) if x.ndim == 2]
    assert len(masters) == len(momentum) == 14
    for x in [*masters.values(), *momentum]:
        assert per_device_fraction(x) == 1 / 8 and len(x.sharding.device_set) == 8
    master_bytes = sum(x.addressable_shards[0].data.nbytes for x in [*masters.values(), *momentum])
    assert master_bytes * 8 == sum(x.nbytes for x in [*masters.values(), *momentum])
    (eval_weights,) = recorded["eval_weights"]                    # once, after the last epoch
    blocks = {k: v for k, v in eval_weights.items() if k.startswith("blocks.")}
    assert len(blocks) == 14 and all(per_device_fraction(v) == 1 / 4 for v in blocks.values())
    assert per_device_fraction(eval_weights["embed.table"]) == 1 / 4


def test_cli_resume_on_four_devices(cli_runs, tmp_path):
    """The (pop=8, model=1) checkpoint written on 8 devices resumes in a process with 4 devices on
    (pop=1, model=4): same parameters as the straight run."""
    import shutil
    import subprocess
    import sys

    from processes import cpu_env

    model, root, straight = cli_runs
    out = tmp_path / "four"
    shutil.copytree(root / "half", out)
    env = cpu_env(4)
    cmd = [sys.executable, "-m", "jaxcore.cli", "es", "--resume", f"model.path={model}", f"train.out_dir={out}",
           *CLI_RUN, "train.epochs=4", "mesh.model=4", "mesh.shard_min_size=1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mesh.model: 1 -> 4" in proc.stderr
    assert_same_final(straight, out, model)


def es_config(path, *overrides):
    from jaxcore.config.yaml_config import load_config
    from jaxcore.es.config import ESConfig

    return load_config(ESConfig, None, [f"model.path={path}", "es.population=16", "optimizer.momentum=0.9",
                                        *overrides])


@pytest.mark.parametrize("min_size,fraction", [(None, 1.0), (1, 1 / 8)])
def test_shard_min_size_shards_the_trainers_masters(tiny_dir, min_size, fraction):
    """The trainer's masters and momentum: replicated by default for tiny weights (2**14 elements),
    1/8 per device with mesh.shard_min_size=1, also after an update."""
    from jaxcore.es.algorithm import EggrollAlgorithm

    path = tiny_dir("llama")
    extra = [] if min_size is None else [f"mesh.shard_min_size={min_size}"]
    algorithm = EggrollAlgorithm(jaxcore.load_hf(path), None, es_config(path, "mesh.model=2", *extra))
    for _ in range(2):
        masters = eggroll.perturbed_params(algorithm.model, algorithm.plan)
        momentum = [x for x in jax.tree.leaves(algorithm.opt_state) if x.ndim == 2]
        assert len(masters) == len(momentum) == 14
        assert all(per_device_fraction(x) == fraction for x in [*masters.values(), *momentum])
        algorithm.opt_state, _ = eggroll.es_step(algorithm.model, algorithm.plan, algorithm.optimizer,
                                                 algorithm.opt_state, 0, np.arange(16.0), donate_params=True)


def test_updates_on_two_mesh_shapes_in_one_process(tiny_dir):
    """A process that updates on mesh (8, 1) and then on (4, 2) (two trainers, or a test session): the
    second update works (JAX's eager dispatch once mapped its gradient norm onto the first mesh)."""
    from jaxcore.es.algorithm import EggrollAlgorithm

    path = tiny_dir("llama")
    for model_size in (1, 2):
        cfg = es_config(path, f"mesh.model={model_size}", "mesh.shard_min_size=1")
        algorithm = EggrollAlgorithm(jaxcore.load_hf(path), None, cfg)
        _, metrics = eggroll.es_step(algorithm.model, algorithm.plan, algorithm.optimizer, algorithm.opt_state,
                                     0, np.arange(16.0), donate_params=True)
        assert np.isfinite(metrics["grad_norm"]) and not metrics["skipped"]


def test_bfloat16_masters(tiny_dir):
    """es.master_dtype=bfloat16: masters and momentum are bf16 (and sharded), an update changes them, and
    the fraction of entries whose fp32 update is rounded away in bf16 is measured (printed)."""
    from jaxcore.es.algorithm import EggrollAlgorithm

    path = tiny_dir("llama")
    cfg = es_config(path, "es.master_dtype=bfloat16", "mesh.shard_min_size=1", "optimizer.learning_rate=1e-3")
    algorithm = EggrollAlgorithm(jaxcore.load_hf(path), None, cfg)
    before = {k: np.asarray(v.astype(np.float32)) for k, v in eggroll.perturbed_params(algorithm.model,
                                                                                       algorithm.plan).items()}
    fp32 = {k: np.asarray(v) for k, v in eggroll.perturbed_params(jaxcore.load_hf(path), algorithm.plan).items()}
    fitness = np.random.default_rng(0).normal(size=16)
    algorithm.opt_state, _ = eggroll.es_step(algorithm.model, algorithm.plan, algorithm.optimizer,
                                             algorithm.opt_state, 0, fitness)
    after = eggroll.perturbed_params(algorithm.model, algorithm.plan)
    assert all(v.dtype == jax.numpy.bfloat16 and per_device_fraction(v) == 1 / 8 for v in after.values())
    momentum = [x for x in jax.tree.leaves(algorithm.opt_state) if x.ndim]
    assert len(momentum) == 14 and all(x.dtype == jax.numpy.bfloat16 for x in momentum)     # not promoted to fp32
    changed = sum(int((np.asarray(v.astype(np.float32)) != before[k]).sum()) for k, v in after.items())
    total = sum(v.size for v in after.values())
    assert changed > 0
    grads = eggroll.estimate_gradient(algorithm.plan, np.int32(0), eggroll.shape_fitness(fitness))
    update = {k: 1e-3 * np.asarray(g) for k, g in grads.items()}       # first step (momentum 0): lr * g
    intended = sum(int((fp32[k] + u != fp32[k]).sum()) for k, u in update.items())
    lost = 1 - changed / intended
    rms = np.sqrt(np.mean(np.concatenate([u.ravel() for u in update.values()]) ** 2))
    weights = np.sqrt(np.mean(np.concatenate([w.ravel() for w in fp32.values()]) ** 2))
    print(f"bf16 masters (SGD lr=1e-3, N=16, tiny llama: update rms {rms:.2e}, weight rms {weights:.2e}): "
          f"{changed}/{total} entries changed, {lost:.1%} of the fp32 updates rounded away")
    assert 0 < lost < 1


def slices(named: jax.sharding.NamedSharding, shape) -> dict:
    """device -> the index ranges (start, stop) per dimension it holds."""
    return {d: tuple((s.start or 0, shape[i] if s.stop is None else s.stop) for i, s in enumerate(idx))
            for d, idx in named.devices_indices_map(shape).items()}


@pytest.mark.parametrize("model_size", [1, 2, 4])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gemma3"])
def test_every_master_slice_lies_inside_its_compute_slice(tiny_dir, family, model_size):
    """Each device's master slice is inside its compute (tensor-parallel) slice and split along a major
    dimension, so re-assembling the compute weights gathers over "pop" only, never a full weight."""
    model = jaxcore.load_hf(tiny_dir(family))
    mesh, head_dim = meshes.es_mesh(model_size), model.config.head_dim
    for path, value in flat_state(model).items():
        shape = tuple(value.shape)
        master = jax.sharding.NamedSharding(mesh, sharding.master_spec(path, shape, mesh, min_size=1,
                                                                       head_dim=head_dim))
        compute = jax.sharding.NamedSharding(mesh, sharding.tensor_parallel_spec(path, shape, meshes.MODEL,
                                                                                   model_size, head_dim))
        inner, outer = slices(master, shape), slices(compute, shape)
        for device, ranges in inner.items():
            assert all(o[0] <= i[0] and i[1] <= o[1] for i, o in zip(ranges, outer[device])), (path, device)
        if shape[0] % 8 == 0:
            assert len(set(inner.values())) == 8, (path, master.spec)   # split 1/8: every device its own slice


def test_masters_loaded_in_place_are_not_copied(tiny_dir):
    """A model loaded straight into the masters' layout: `shard_masters` leaves every leaf as it is."""
    mesh = meshes.es_mesh(2)
    model = jaxcore.load_hf(tiny_dir("llama"), shardings=sharding.master_shardings(mesh, min_size=1))
    before = flat_state(model)
    shard_masters(model, mesh, min_size=1)
    assert all(flat_state(model)[k] is v for k, v in before.items())
    shard_masters(model, mesh, "bfloat16", min_size=1)           # another dtype: every leaf is cast
    assert all(v.dtype == jax.numpy.bfloat16 for v in flat_state(model).values())


def test_grpo_adamw_moments_follow_the_fsdp_parameters(tiny_dir, grpo_job):
    """GRPO with fsdp=2: AdamW's moments are sharded like the parameters they mirror (not replicated)."""
    import optax

    from jaxcore.grpo.learner import GRPOLearner

    learner = GRPOLearner(jaxcore.load_hf(tiny_dir("llama")), grpo_job(), mesh=meshes.grpo_mesh(2),
                          fsdp_min_size=1)
    params = jax.tree.leaves(learner.state.params)
    mu, nu = (optax.tree_utils.tree_get(learner.state.opt_state, name) for name in ("mu", "nu"))
    for moments in (mu, nu):
        for p, m in zip(params, jax.tree.leaves(moments)):
            assert m.sharding.is_equivalent_to(p.sharding, p.ndim)
    assert any(per_device_fraction(m) == 1 / 2 for m in jax.tree.leaves(mu))


def test_planner_follows_shard_min_size(tiny_dir):
    """`jaxcore plan`'s master term is the trainer's own per-device master bytes, for either
    mesh.shard_min_size (tiny weights replicated by default, 1/8 each with 1)."""
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.es.memory import plan_job as plan_es_config

    path = tiny_dir("llama")
    for extra in ([], ["mesh.shard_min_size=1"]):
        cfg = es_config(path, "mesh.model=2", *extra)
        algorithm = EggrollAlgorithm(jaxcore.load_hf(path), None, cfg)
        held = sum(x.addressable_shards[0].data.nbytes for x in flat_state(algorithm.model).values())
        planned = plan_es_config(cfg, algorithm.model.config, devices=8).terms["master weights"]
        np.testing.assert_allclose(planned, held, rtol=1e-6)


@pytest.mark.parametrize("model_size", [2, 4])
def test_tensor_parallel_attention_splits_only_between_whole_heads(tiny_dir, model_size):
    """Tiny Gemma 3 has 4 query heads and 2 key/value heads of width 32: on a model axis of 4 the key/value
    projections stay whole (a split would cut each head's dot product in half), q and o split by heads; the
    compute copy the trainer builds (`compute_model`) and the planner follow the same layout."""
    from jaxcore.es.algorithm import compute_model
    from jaxcore.runtime.memory import split_divisors

    model = jaxcore.load_hf(tiny_dir("gemma3"))
    cfg = model.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 32)
    mesh = meshes.es_mesh(model_size)
    compute = flat_state(compute_model(model, mesh))
    kv_split = cfg.num_kv_heads % model_size == 0
    for name, heads, dim in (("q", cfg.num_heads, 1), ("k", cfg.num_kv_heads, 1), ("v", cfg.num_kv_heads, 1),
                             ("o", cfg.num_heads, 0)):
        weight = compute[f"blocks.0.attn.{name}.kernel"]
        spec = tuple(weight.sharding.spec) + (None, None)
        split = heads % model_size == 0
        assert (spec[dim] == meshes.MODEL) == split, (name, spec)
        rows = {tuple((s.start or 0, s.stop) for s in index) for index in
                weight.sharding.devices_indices_map(tuple(weight.shape)).values()}
        widths = {r[dim][1] - r[dim][0] if r[dim][1] is not None else weight.shape[dim] for r in rows}
        assert all(w % cfg.head_dim == 0 for w in widths), (name, widths)     # whole heads on every device
        divisors = split_divisors(f"blocks.0.attn.{name}.kernel", tuple(weight.shape), model_size, cfg.head_dim)
        assert divisors[dim] == (model_size if split else 1), (name, divisors)     # the planner counts the same
    assert kv_split == (model_size == 2)
