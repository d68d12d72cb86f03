"""EGGROLL units: noise from keys, antithetic pairs, shaping, the gradient estimate, one big matmul, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.es import eggroll
from jaxcore.inference.generate import decode, generate
from jaxcore.model.state import flat_state
from jaxcore.parallel import meshes, sharding
from jaxcore.runtime.optim import OptimizerConfig, make_optimizer


@pytest.fixture
def llama(tiny_dir):
    return jaxcore.load_hf(tiny_dir("llama"))


def noise_of(model, epoch, **options):
    cfg = eggroll.EggrollConfig(**{"population": 6, "rank": 2, "sigma": 0.1, "seed": 3, **options})
    plan = eggroll.make_plan(model, cfg)
    return plan, jax.tree.map(np.asarray, eggroll.member_noise(plan, jnp.int32(epoch)))


def test_antithetic_pairs_share_noise_with_opposite_signs(llama):
    _, noise = noise_of(llama, epoch=0, non_matrix="full")
    members = [noise.of_member(i) for i in range(6)]
    path = "blocks.1.mlp.up.kernel"
    np.testing.assert_array_equal(members[0][0][path][0], members[1][0][path][0])
    np.testing.assert_array_equal(members[0][0][path][1], -members[1][0][path][1])
    assert not np.allclose(members[0][0][path][0], members[2][0][path][0])
    norm = "blocks.0.attn_norm.scale"
    np.testing.assert_array_equal(members[4][1][norm], -members[5][1][norm])


def test_factors_follow_the_design_formula(llama):
    plan, noise = noise_of(llama, epoch=7, noise_reuse=2)
    path = "blocks.0.attn.q.kernel"
    rows, cols = llama.config.hidden_size, llama.config.num_heads * llama.config.head_dim
    key = eggroll.parameter_keys(sorted(flat_state(llama)), seed=3)[path]
    for member in (2, 3):
        ab = jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, 7 // 2), member // 2), (rows + cols, 2))
        sign = 1 if member % 2 == 0 else -1
        a, b = noise.of_member(member)[0][path]
        np.testing.assert_allclose(a, ab[:rows], rtol=1e-6)
        np.testing.assert_allclose(b, sign * 0.1 / np.sqrt(2) * ab[rows:], rtol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_batched_draw_equals_one_draw_per_target(tiny_dir, family):
    """pair_factors draws each kind's layers in one vmapped program: bit-identical to drawing every
    target from its own key (matrices and, with non_matrix=full, norms and biases)."""
    model = jaxcore.load_hf(tiny_dir(family))
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=6, rank=2, seed=5, noise_reuse=2,
                                                          non_matrix="full", include_lm_head=True))
    drawn = eggroll.pair_factors(plan, jnp.int32(5), jnp.arange(3))
    assert set(drawn) == {t.path for t in plan.targets}
    for target in plan.targets:
        shape = (sum(target.shape), 2) if target.low_rank else target.shape
        for pair in range(3):
            key = jax.random.fold_in(jax.random.fold_in(plan.keys[target.path], 5 // 2), pair)
            np.testing.assert_array_equal(drawn[target.path][pair], jax.random.normal(key, shape), target.path)


def test_noise_reuse_and_options_do_not_shift_keys(llama):
    _, e0 = noise_of(llama, epoch=0, noise_reuse=2)
    _, e1 = noise_of(llama, epoch=1, noise_reuse=2)
    _, e2 = noise_of(llama, epoch=2, noise_reuse=2)
    path = "blocks.0.mlp.down.kernel"
    np.testing.assert_array_equal(e0.low_rank[path][0], e1.low_rank[path][0])
    assert not np.allclose(e0.low_rank[path][0], e2.low_rank[path][0])
    assert e0.low_rank[path][0].shape[0] == 3          # one factor set per antithetic pair
    _, with_head = noise_of(llama, epoch=0, noise_reuse=2, include_lm_head=True, non_matrix="full")
    np.testing.assert_array_equal(e0.low_rank[path][0], with_head.low_rank[path][0])
    assert "lm_head.kernel" in with_head.low_rank and "lm_head.kernel" not in e0.low_rank
    assert "embed.table" not in with_head.low_rank


def test_shape_fitness_hand_worked():
    f = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(eggroll.shape_fitness(f, "zscore"), (f - 2.5) / np.sqrt(1.25 + 1e-5), rtol=1e-6)
    grouped = eggroll.shape_fitness(f, "group_zscore", group_size=2)
    np.testing.assert_allclose(grouped, np.array([-0.5, 0.5, -0.5, 0.5]) / np.sqrt(1.25 + 1e-5), rtol=1e-6)
    ranks = eggroll.shape_fitness(np.array([5.0, 1.0, 5.0, 3.0, 0.0]), "centered_rank")
    np.testing.assert_allclose(ranks, [0.375, -0.25, 0.375, 0.0, -0.5])
    with pytest.raises(ValueError, match="group_size"):
        eggroll.shape_fitness(f, "group_zscore", group_size=3)
    with pytest.raises(ValueError, match="unknown fitness shaping"):
        eggroll.shape_fitness(f, "softmax")


@pytest.mark.parametrize("mode", ["zscore", "group_zscore"])
def test_shape_fitness_of_rewards_near_float32s_limit(mode):
    """Finite fitness of ~1e20 (squares past float32's limit) keeps its z-scores (before: the variance was inf and
    every z-score 0, a zero update reported as not skipped); small fitness keeps its numbers bit for bit."""
    f = np.array([1.0, 2.0, 3.0, 4.0])
    expected = eggroll.shape_fitness(f, mode, group_size=2)
    np.testing.assert_allclose(eggroll.shape_fitness(f * 1e20, mode, group_size=2), expected, rtol=1e-5)
    np.testing.assert_allclose(eggroll.shape_fitness(f * 3e37, mode, group_size=2), expected, rtol=1e-5)
    small = np.random.default_rng(0).normal(size=8).astype(np.float32)
    centred = small - small.mean() if mode == "zscore" else small - np.repeat(small.reshape(-1, 2).mean(1), 2)
    import jax.numpy as jnp

    plain = (jnp.asarray(centred) if mode == "group_zscore" else jnp.asarray(small) - jnp.asarray(small).mean())
    assert np.array_equal(eggroll.shape_fitness(small, mode, group_size=2),
                          plain / jnp.sqrt(jnp.asarray(small).var() + 1e-5))


def test_gradient_equals_explicit_sum_over_members(llama):
    plan, noise = noise_of(llama, epoch=4, non_matrix="full")
    fitness = np.array([0.5, -1.0, 2.0, 0.0, 1.5, -0.25], np.float32)
    grads = eggroll.estimate_gradient(plan, jnp.int32(4), jnp.asarray(fitness))
    members = [noise.of_member(i) for i in range(6)]         # b carries sign * sigma / sqrt(r): sigma * eps_i
    sigma = plan.config.sigma
    path = "blocks.1.attn.v.kernel"
    explicit = sum(fitness[i] * members[i][0][path][0] @ members[i][0][path][1].T for i in range(6)) / 6 / sigma
    np.testing.assert_allclose(grads[path], explicit, atol=1e-5)
    explicit = sum(fitness[i] * members[i][1]["final_norm.scale"] for i in range(6)) / 6 / sigma   # sign * eps
    np.testing.assert_allclose(grads["final_norm.scale"], explicit, atol=1e-5)


def test_base_matmul_is_one_gemm_over_the_population(llama):
    plan, _ = noise_of(llama, epoch=0)
    pop = eggroll.population(llama, plan, 0)
    ids = jnp.ones((12, 5), jnp.int32)                         # 6 members x 2 rows
    jaxpr = jax.make_jaxpr(lambda x: pop(x))(ids)
    kernel_shape = tuple(llama.blocks[0].mlp.up.kernel.get_value().shape)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    base = [e for e in dots if tuple(e.invars[1].aval.shape) == kernel_shape]
    assert base, "x @ W not found"
    for eqn in base:
        assert eqn.params["dimension_numbers"][1] == ((), ())     # no batch dimension: one GEMM
        assert eqn.invars[0].aval.shape[0] == 12 * 5              # over every member's rows (flattened with positions)
    assert not any(e.primitive.name == "while" for e in jaxpr.jaxpr.eqns)


def test_population_decode_has_plain_inference_memory_and_no_noise_generation(llama):
    """Factors are made once per epoch (the decode loop only reads them), and no cache is copied."""
    from jaxcore.bench.es import generate_bytes

    plan, _ = noise_of(llama, epoch=0)
    pop = eggroll.population(llama, plan, 0)
    ids = np.ones((6, 8), np.int32)
    plain, population = generate_bytes(llama, ids, 16), generate_bytes(pop, ids, 16)
    noise = sum(x.nbytes for x in jax.tree.leaves(eggroll.member_noise(plan, jnp.int32(0))))
    # The decode loop updates the cache in place: no copy of it, only the factors on top.
    assert population["decode"] - plain["decode"] < noise + plain["cache"] // 2

    from jaxcore.inference.sampling import SamplingConfig
    from jaxcore.model.transformer import KVCache

    cache = KVCache.create(llama.config, 6, 24, jnp.float32)
    jaxpr = jax.make_jaxpr(lambda m, c: decode.__wrapped__(
        m, c, jnp.zeros((6, llama.config.vocab_size)), jnp.ones(6, jnp.int32), jnp.int32(16),
        jax.random.key(0), max_new_tokens=4, sampling=SamplingConfig(temperature=0.0), eos_ids=(), pad_id=0))(
        pop, cache)
    assert "random_bits" not in str(jaxpr) and "threefry" not in str(jaxpr)


def abstract_llama(layers: int):
    """A tiny-width Llama of `layers` layers as shapes only (no weights): enough for a noise plan."""
    from flax import nnx

    from jaxcore.hf.tiny import hf_config
    from jaxcore.model.families import config_from_hf
    from jaxcore.model.transformer import Transformer

    config = config_from_hf(hf_config("llama", "tiny", vocab_size=259, layers=layers).to_dict())
    return nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_noise_and_gradient_programs_hold_the_normal_once_per_kind_of_matrix(dtype):
    """The normal's inverse-erf polynomial (its selects) is compiled once per kind of matrix, whatever the
    depth. Before, XLA fused it into every layer's slice of the draw: the population's noise had 308 selects
    at 2 layers and 924 at 6, the gradient estimate 336 and 952; at 135M they took 8.5-9.9 s and 10.3 s of
    XLA:CPU compilation (now ~3.5 s and ~6 s to the first result)."""
    noise_selects, gradient_selects = [], []
    for layers in (2, 6):
        plan = eggroll.make_plan(abstract_llama(layers), eggroll.EggrollConfig(population=16, rank=1))
        groups = eggroll._group_noise.lower(plan, jnp.int32(0), dtype, None)
        layer_cut = eggroll._layer_noise.lower(groups.out_info, eggroll._target_groups(plan), None)
        noise_selects.append(sum(stage.compile().as_text().count(" select(") for stage in (groups, layer_cut)))
        draw = eggroll._regenerated_draws.lower(plan, jnp.int32(0), None)
        products = eggroll._gradient_from_draws.lower(draw.out_info, jnp.zeros(16), eggroll._target_groups(plan),
                                                      plan.config, None)
        gradient_selects.append(sum(stage.compile().as_text().count(" select(") for stage in (draw, products)))
    assert noise_selects[0] == noise_selects[1] > 0, noise_selects
    assert gradient_selects[0] == gradient_selects[1] > 0, gradient_selects


def test_each_device_draws_only_its_own_pairs():
    """On a mesh with the population over "pop", the per-kind draws are sharded over their pair axis."""
    mesh = meshes.make_mesh({"pop": -1}, jax.devices()[:8])
    rows = meshes.leading_axis(mesh, "pop")
    plan = eggroll.make_plan(abstract_llama(2), eggroll.EggrollConfig(population=16, rank=1))
    for drawn in eggroll._group_noise(plan, jnp.int32(0), jnp.float32, rows):
        assert drawn.sharding.spec[:2] == (None, "pop"), drawn.sharding
        assert drawn.addressable_shards[0].data.shape[1] == 1             # 8 pairs over 8 devices


def test_the_gradient_of_replicated_masters_is_drawn_and_kept_on_every_device():
    """Masters replicated over a "pop" mesh: the gradient comes back on every device of the mesh, each
    drawing the factors itself (no draw on one device broadcast to the others)."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = meshes.make_mesh({"pop": -1}, jax.devices()[:8])
    everywhere = NamedSharding(mesh, PartitionSpec())
    plan = eggroll.make_plan(abstract_llama(2), eggroll.EggrollConfig(population=16, rank=1))
    grads = eggroll.estimate_gradient(plan, jnp.int32(0), jnp.arange(16.0),
                                      out_sharding=tuple((t.path, everywhere) for t in plan.targets))
    assert all(g.sharding.is_equivalent_to(everywhere, g.ndim) for g in grads.values())
    compiled = eggroll._regenerated_draws.lower(plan, jnp.int32(0), everywhere).compile()
    assert all(sharding.is_equivalent_to(everywhere, 3) for sharding in compiled.output_shardings)


def train_two_epochs(path, devices):
    model = jaxcore.load_hf(path)
    mesh = meshes.make_mesh({"pop": -1}, devices)
    sharding.replicate_model(model, mesh)
    rows = meshes.leading_axis(mesh, "pop")
    cfg = eggroll.EggrollConfig(population=16, rank=1, sigma=0.05, seed=1)
    plan = eggroll.make_plan(model, cfg)
    optimizer = make_optimizer(OptimizerConfig("sgd"), learning_rate=0.025)
    opt_state = optimizer.init(eggroll.perturbed_params(model, plan))
    rng = np.random.default_rng(0)
    ids = np.repeat(rng.integers(3, 200, (2, 6)), 16, axis=0)      # 16 members x 2 prompts
    mask = np.ones_like(ids)
    for epoch in range(2):
        pop = eggroll.population(model, plan, epoch, out_sharding=rows)
        result = generate(pop, ids, mask, max_new_tokens=6, temperature=0.0, row_sharding=rows)
        fitness = np.asarray(result.logprobs).reshape(16, -1).mean(1)   # gathered: N floats
        opt_state, _ = eggroll.es_step(model, plan, optimizer, opt_state, epoch, fitness)
    return {k: np.asarray(v) for k, v in flat_state(model).items()}


def test_one_and_eight_devices_give_the_same_parameters(tiny_dir):
    assert jax.device_count() == 8
    path = tiny_dir("qwen3")
    one = train_two_epochs(path, jax.devices()[:1])
    eight = train_two_epochs(path, jax.devices())
    start = {k: np.asarray(v) for k, v in flat_state(jaxcore.load_hf(path)).items()}
    assert any(not np.array_equal(one[k], start[k]) for k in one)
    for key in one:
        np.testing.assert_allclose(one[key], eight[key], atol=1e-6, rtol=0, err_msg=key)


def test_config_validation():
    with pytest.raises(ValueError, match="even"):
        eggroll.EggrollConfig(population=5)
    with pytest.raises(ValueError, match="non_matrix"):
        eggroll.EggrollConfig(non_matrix="lowrank")


def test_include_lm_head_perturbs_a_tied_head(tiny_dir, llama):
    """A tied LM head is the embedding table: include_lm_head perturbs it (it was a silent no-op)."""
    def targets(model, **options):
        return {t.path for t in eggroll.make_plan(model, eggroll.EggrollConfig(population=4, **options)).targets}

    tied = jaxcore.load_hf(tiny_dir("qwen3"))
    assert tied.config.tie_word_embeddings
    assert targets(tied, include_lm_head=True) == targets(tied) | {"embed.table"}
    assert targets(llama, include_lm_head=True) == targets(llama) | {"lm_head.kernel"}      # untied: its own head
    assert "embed.table" not in targets(llama, include_lm_head=True)


@pytest.mark.parametrize("learning_rate", [float("nan"), float("inf")])
def test_a_non_finite_update_is_never_applied(llama, learning_rate):
    """A finite gradient with a NaN/Inf learning rate gives a non-finite update: the step is skipped inside the
    jitted update (old parameters and optimizer state kept), not written into the weights."""
    import optax

    plan, _ = noise_of(llama, epoch=0)
    optimizer = optax.sgd(learning_rate)                    # built directly: make_optimizer refuses this rate
    before = {k: np.asarray(v) for k, v in flat_state(llama).items()}
    opt_state = optimizer.init(eggroll.perturbed_params(llama, plan))
    fitness = np.array([0.5, -1.0, 2.0, 0.0, 1.5, -0.25], np.float32)
    opt_state, update = eggroll.es_step(llama, plan, optimizer, opt_state, 0, fitness, donate_params=True)
    assert update["skipped"] and np.isfinite(update["grad_norm"])
    after = {k: np.asarray(v) for k, v in flat_state(llama).items()}
    for path, value in before.items():
        np.testing.assert_array_equal(after[path], value)


def test_compute_weights_already_in_place_are_not_copied(llama, tiny_dir):
    """Each epoch evaluates the population on compute weights made from the masters. Where the masters already
    have the compute layout and dtype (one device, fp32) that is the masters themselves: copying them cost two
    passes over the weights per epoch (0.12 s of a 5 s SmolLM2-135M epoch on two CPU cores)."""
    from jaxcore.es.algorithm import compute_model, shard_masters

    mesh = meshes.es_mesh(1, jax.devices()[:1])
    shard_masters(llama, mesh)
    masters = flat_state(llama)
    computed = flat_state(compute_model(llama, mesh))
    assert all(computed[path].unsafe_buffer_pointer() == masters[path].unsafe_buffer_pointer() for path in masters)
    half = jaxcore.load_hf(tiny_dir("llama"), dtype="bfloat16")          # bf16 compute from fp32 masters: cast
    shard_masters(half, mesh)
    computed = flat_state(compute_model(half, mesh))
    assert all(computed[path].dtype == jnp.bfloat16 for path in computed if computed[path].dtype.kind == "f")
    assert all(flat_state(half)[path].dtype == jnp.float32 for path in computed if computed[path].dtype.kind == "f")


def test_the_sgd_update_passes_over_the_weights_five_and_a_half_times(llama):
    """ES's default update (SGD) reads the weights and g to check that p + u is finite, then reads them again to
    write p + u: XLA counts 5.5 passes over the perturbed weights' bytes. Keeping p + u for a select and checking
    u separately counted 9 (its finiteness and select fusions: ~0.2 s of thread time per SmolLM2-135M
    epoch on two CPU cores, from a profile). A skipped step still returns every
    weight as it was, signed zeros included."""
    plan, _ = noise_of(llama, epoch=0)
    params = eggroll.perturbed_params(llama, plan)
    weight_bytes = sum(x.nbytes for x in params.values())
    grads = eggroll.estimate_gradient(plan, jnp.int32(0), jnp.arange(6.0))
    optimizer = make_optimizer(OptimizerConfig(name="sgd", learning_rate=1e-3), total_steps=4)
    cost = eggroll.apply_update.lower(params, optimizer.init(params), grads, optimizer).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["bytes accessed"] / weight_bytes <= 6, cost["bytes accessed"] / weight_bytes

    import optax

    zeros = {path: jnp.full_like(value, -0.0) for path, value in params.items()}
    broken = optax.sgd(float("nan"))
    kept, _, applied = eggroll.apply_update(zeros, broken.init(zeros), grads, broken)
    assert not bool(applied)
    assert all(bool(jnp.signbit(value).all()) for value in kept.values())


def test_a_fitness_shaping_is_one_registry_entry(monkeypatch):
    """A mode added to `SHAPERS` is taken by `shape_fitness` (and so by the update) as is; an unknown one names the
    registry's."""
    from jaxcore.es import shaping

    monkeypatch.setitem(shaping.SHAPERS, "doubled", lambda f_N, group_size: 2.0 * f_N)
    np.testing.assert_allclose(eggroll.shape_fitness([1.0, -2.0], "doubled"), [2.0, -4.0])
    monkeypatch.delitem(shaping.SHAPERS, "doubled")
    with pytest.raises(ValueError, match="choose from zscore, group_zscore, centered_rank, none"):
        eggroll.shape_fitness([1.0], "doubled")
