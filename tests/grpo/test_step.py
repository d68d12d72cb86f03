"""The jit'd GRPO step: accumulation, mu > 1, truncation masking, sharding, the reference model, learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adam_steps import train_in_lockstep
from flax import nnx

import jaxcore
from jaxcore.bench.grpo import EOS_ID
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.loss import grpo_loss
from jaxcore.grpo.step import build_batch, loss_mask, policy_logps, rollout_metrics
from jaxcore.inference.logprobs import completion_logprobs
from jaxcore.parallel.config import SHARD_MIN_SIZE
from jaxcore.parallel.meshes import make_mesh
from jaxcore.runtime.optim import make_schedule

score = nnx.jit(policy_logps)


@pytest.fixture(scope="module")
def batch_rows() -> int:
    """16 rows (the shared `batch` has 8): two micro-batches that each still split over 8 devices."""
    return 16


def logp_of(model, batch) -> np.ndarray:
    return np.asarray(score(model, jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT))[0])


def params_of(learner: GRPOLearner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(learner.state.params)]


def initial_params(path) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.to_pure_dict(nnx.state(jaxcore.load_hf(path), nnx.Param)))]


def test_build_batch_layout():
    prompt_ids = np.array([[0, 5, 6], [7, 8, 9]])
    prompt_mask = np.array([[0, 1, 1], [1, 1, 1]])
    completion_ids = np.array([[10, EOS_ID, 0, 0], [11, 12, 13, 14]])
    completion_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    b = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, [1.0, -1.0], (EOS_ID,))
    assert b.input_ids_BT.shape == (2, 7) and b.completion_mask_BL.shape == (2, 6)
    # position t scores token t + 1: the completion tokens sit at 3.. so positions 2.. are trained
    np.testing.assert_array_equal(b.completion_mask_BL, [[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(b.truncated_B, [False, True])
    np.testing.assert_array_equal(b.attention_mask_BT, [[0, 1, 1, 1, 1, 0, 0], [1] * 7])
    m = rollout_metrics(b)
    assert (m["completions/mean_length"], m["completions/clipped_ratio"]) == (3.0, 0.5)
    assert m["completions/max_terminated_length"] == 2.0 and m["rollout_tokens"] == 11.0
    # TRL's eos_and_pad: a completion that ends in the pad token (sampled as a real token) is not truncated
    ends_in_pad = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, [1.0, -1.0], (EOS_ID,),
                              pad_token_id=14)
    np.testing.assert_array_equal(ends_in_pad.truncated_B, [False, False])


def test_policy_logps_match_completion_logprobs(path, batch):
    """At every position whose query token is real (all the loss can read). A padding query attends to no real
    token, so its junk output depends on the sequence's length, which policy_logps shortens by the last token."""
    model = jaxcore.load_hf(path)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    real_BL = np.asarray(batch.attention_mask_BT, bool)[:, :-1]
    np.testing.assert_allclose(logp_of(model, batch)[real_BL],
                               np.asarray(nnx.jit(completion_logprobs)(model, ids, mask))[real_BL], rtol=1e-5,
                               atol=1e-5)


def test_dapo_accumulation_equals_one_batch(path, batch, grpo_job):
    """Two micro-batches (with remat, which must not change any number) == one batch: the same AdamW step, to the
    rounding of another summation order (`adam_steps.train_in_lockstep`)."""
    cfg = dict(loss_type="dapo", learning_rate=1e-3, max_completion_length=8)
    one = GRPOLearner(jaxcore.load_hf(path), grpo_job(**cfg))
    two = GRPOLearner(jaxcore.load_hf(path), grpo_job(**cfg, gradient_accumulation_steps=2), remat=True)
    assert two.model.remat and not one.model.remat
    [(m2, m1)] = train_in_lockstep(two, one, batch)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5, abs=1e-7)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert m1["loss_tokens"] == m2["loss_tokens"] == batch.completion_mask_BL.sum()
    assert max(np.abs(a - b).max() for a, b in zip(params_of(one), initial_params(path))) > 1e-3


def test_num_iterations_reuse_stored_old_logp(path, batch, grpo_job):
    cfg = grpo_job(loss_type="bnpo", num_iterations=2, learning_rate=3e-3, max_completion_length=8)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg)
    initial = logp_of(learner.model, batch)
    prepared = learner.prepare(batch)
    scored = np.arange(initial.shape[1]) >= batch.completion_start      # the prompt's positions: no LM head
    real = scored & np.asarray(batch.attention_mask_BT, bool)[:, 1:]     # padding scores junk, as it may
    np.testing.assert_allclose(np.asarray(prepared.old_logp_BL)[real], initial[real], rtol=1e-5, atol=1e-5)
    assert not np.asarray(prepared.old_logp_BL)[:, ~scored].any()
    first = learner.step(prepared)
    now = logp_of(learner.model, batch)
    second = learner.step(prepared)
    args = (jnp.asarray(batch.advantages_B), jnp.asarray(batch.completion_mask_BL), cfg.grpo)
    expected, metrics = grpo_loss(jnp.asarray(now), prepared.old_logp_BL, None, *args)
    on_policy, _ = grpo_loss(jnp.asarray(now), None, None, *args)
    assert second["loss"] == pytest.approx(float(expected), rel=1e-4)
    assert abs(float(expected) - float(on_policy)) > 1e-3          # the stored values matter
    assert second["clip_ratio/region_mean"] == pytest.approx(float(metrics["clip_ratio/region_mean"]))
    assert first["clip_ratio/region_mean"] == 0.0 and second["clip_ratio/region_mean"] > 0


def test_truncated_completions_are_masked(batch, grpo_job):
    """mask_truncated_completions == zeroing those rows' completion masks, in the loss and its normaliser."""
    assert batch.truncated_B.any() and not batch.truncated_B.all()
    logp = jnp.asarray(np.random.default_rng(0).normal(-3, 1, batch.completion_mask_BL.shape), jnp.float32)
    old = logp + 0.3
    zeroed = batch.replace(completion_mask_BL=batch.completion_mask_BL * ~batch.truncated_B[:, None])
    cfg = grpo_job(loss_type="dapo", max_completion_length=8)

    def loss(b, mask_truncated: bool) -> float:
        mask = loss_mask(jax.tree.map(jnp.asarray, b), mask_truncated)
        return float(grpo_loss(logp, old, None, jnp.asarray(b.advantages_B), mask, cfg.grpo, mask.sum(),
                               max_completion_length=cfg.rollout.max_new_tokens)[0])

    assert loss(batch, True) == pytest.approx(loss(zeroed, False), rel=1e-6)
    assert abs(loss(batch, True) - loss(batch, False)) > 1e-3
    assert int(loss_mask(jax.tree.map(jnp.asarray, batch), True).sum()) == int(zeroed.completion_mask_BL.sum())


MESH_CFG = dict(loss_type="dapo", beta=0.04, num_iterations=2, gradient_accumulation_steps=2,
                learning_rate=0.5, lr_schedule="constant", max_grad_norm=0.0, max_completion_length=8)


def sgd_learner(grpo_job, path, load_ref, mesh, fsdp_min_size=SHARD_MIN_SIZE) -> GRPOLearner:
    """A learner with plain SGD (no Adam 1/sqrt(v) amplification of summation-order noise), so the
    meshes are compared at 1e-6."""
    import optax

    from jaxcore.grpo import learner as grpo_learner

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo_learner, "make_optimizer",
                      lambda opt, total_steps, **_: optax.sgd(make_schedule(opt, total_steps)))
        return GRPOLearner(jaxcore.load_hf(path), grpo_job(**MESH_CFG), mesh=mesh, ref_model=load_ref,
                           fsdp_min_size=fsdp_min_size)


@pytest.fixture(scope="module")
def one_device(path, tiny_dir, batch, grpo_job):
    ref = lambda: jaxcore.load_hf(tiny_dir("llama", seed=1))     # noqa: E731
    one = sgd_learner(grpo_job, path, ref, make_mesh({"data": 1}, devices=jax.devices()[:1]))
    return one.train_on_rollout(batch), params_of(one)


@pytest.mark.parametrize("fsdp", [1, 2, 4])
def test_eight_devices_match_one(path, tiny_dir, batch, one_device, fsdp, grpo_job):
    """Two SGD steps (num_iterations=2, accumulation 2, KL to a reference) on 8 devices as the trainer
    builds them (`grpo_mesh`: data x fsdp) give one device's parameters to 1e-6."""
    from jaxcore.parallel.meshes import grpo_mesh

    assert jax.device_count() == 8
    calls = []

    def load_ref():
        calls.append(1)
        return jaxcore.load_hf(tiny_dir("llama", seed=1))

    mesh = grpo_mesh(fsdp)
    assert dict(mesh.shape) == ({"data": 8 // fsdp, "fsdp": fsdp} if fsdp > 1 else {"data": 8})
    eight = sgd_learner(grpo_job, path, load_ref, mesh, fsdp_min_size=1024)
    assert len(calls) == 1
    sharded = [x for x in jax.tree.leaves(eight.state.params) if not x.sharding.is_fully_replicated]
    if fsdp > 1:
        assert len(sharded) >= 5 and all(len(x.sharding.device_set) == 8 for x in sharded)
        assert all(x.addressable_shards[0].data.size == x.size // fsdp for x in sharded)
    else:
        assert not sharded
    metrics_one, params_one = one_device
    metrics_eight = eight.train_on_rollout(batch)
    assert len(metrics_eight) == 2
    for m1, m8 in zip(metrics_one, metrics_eight, strict=True):
        for key in ("loss", "kl", "grad_norm", "entropy", "clip_ratio/region_mean"):
            assert m1[key] == pytest.approx(m8[key], rel=1e-4, abs=1e-6), key
    assert metrics_one[1]["kl"] > 0.01
    for x, y in zip(params_one, params_of(eight), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    assert max(np.abs(a - b).max() for a, b in zip(params_one, initial_params(path))) > 1e-3


def test_grpo_and_es_build_meshes_with_one_helper(monkeypatch):
    """`grpo.fsdp` and `mesh.model` both go through `meshes.make_mesh` (one way to build meshes)."""
    from jaxcore.parallel import meshes

    calls, make = [], meshes.make_mesh
    monkeypatch.setattr(meshes, "make_mesh", lambda sizes, devices=None: calls.append(dict(sizes)) or
                        make(sizes, devices))
    meshes.grpo_mesh(2)
    meshes.es_mesh(4)
    assert calls == [{"data": -1, "fsdp": 2}, {"pop": -1, "model": 4}]


def test_beta_zero_learner_ignores_the_reference_and_learns(path, batch, grpo_job):
    """A few steps on positive-advantage completions make them likelier (negative ones less likely),
    with beta = 0 never loading the reference nor reading (NaN-poisoned) reference log-probs."""
    def forbidden():
        raise AssertionError("the reference model was loaded with beta == 0")

    advantages = np.where(np.arange(16) % 2 == 0, 1.0, -1.0).astype(np.float32)
    poisoned = batch.replace(advantages_B=advantages,
                             ref_logp_BL=np.full(batch.completion_mask_BL.shape, np.nan, np.float32))
    mask = batch.completion_mask_BL.astype(bool)
    cfg = grpo_job(loss_type="grpo", learning_rate=1e-3, max_completion_length=8)
    learner = GRPOLearner(jaxcore.load_hf(path), cfg, ref_model=forbidden)
    assert learner.ref is None and learner.prepare(batch).ref_logp_BL is None

    def mean_logp(sign: float) -> float:
        logp = logp_of(learner.model, batch)
        return float(logp[(advantages == sign)[:, None] & mask].mean())

    before = mean_logp(1.0), mean_logp(-1.0)
    metrics = [learner.train_on_rollout(poisoned)[0] for _ in range(4)]
    after = mean_logp(1.0), mean_logp(-1.0)
    assert after[0] > before[0] + 0.1
    assert after[1] < before[1] - 0.1
    assert all("kl" not in m and np.isfinite(list(m.values())).all() for m in metrics)


def test_schedule_and_config_validation(grpo_job):
    def schedule(**flat):
        cfg = grpo_job(**flat)
        return make_schedule(cfg.optimizer, cfg.total_steps)

    sched = schedule(learning_rate=1.0, warmup_steps=4, lr_schedule="cosine", total_steps=12)
    assert [round(float(sched(s)), 4) for s in (0, 2, 4, 8, 12)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    const = schedule(learning_rate=2.0, warmup_steps=2, lr_schedule="constant")
    assert [float(const(s)) for s in (0, 1, 2, 50)] == [0.0, 1.0, 2.0, 2.0]
    linear = schedule(learning_rate=1.0, warmup_steps=2, total_steps=6)   # TRL's default
    assert [float(linear(s)) for s in (0, 1, 2, 4, 6, 9)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    with pytest.raises(ValueError):
        grpo_job(lr_schedule="exponential")                     # GRPOConfig.validate
    with pytest.raises(ValueError):
        grpo_job(gradient_accumulation_steps=0)                 # GRPOOptions


def test_batch_must_split_over_micro_batches_and_devices(path, batch, grpo_job):
    learner = GRPOLearner(jaxcore.load_hf(path), grpo_job(gradient_accumulation_steps=3))
    with pytest.raises(ValueError, match="micro-batches"):
        learner.prepare(batch)


@pytest.mark.parametrize("learning_rate", [float("nan"), float("inf")])
def test_a_non_finite_update_is_never_applied(path, batch, grpo_job, monkeypatch, learning_rate):
    """Finite loss and gradients with a NaN/Inf learning rate: the update is not finite, so the jitted step keeps
    the parameters, moments and step count, reports `skipped`, and the rollout stops there."""
    import optax

    from jaxcore.grpo import learner as learner_module

    monkeypatch.setattr(learner_module, "make_optimizer", lambda cfg, total_steps, **_: optax.sgd(learning_rate))
    learner = GRPOLearner(jaxcore.load_hf(path), grpo_job(loss_type="grpo", max_completion_length=8))
    before = params_of(learner)
    steps = learner.train_on_rollout(batch)
    assert len(steps) == 1 and steps[0]["skipped"] == 1.0
    assert np.isfinite(steps[0]["loss"]) and np.isfinite(steps[0]["grad_norm"])
    assert not learner_module.finite(steps[0]) and int(learner.state.step) == 0
    for x, y in zip(params_of(learner), before, strict=True):
        np.testing.assert_array_equal(x, y)
