"""GRPO in jaxcore vs the TRL-formula torch reference on the HF model: advantages, loss, metrics, gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jaxcore
import torchref.grpo as tgrpo
from jaxcore.bench.grpo import synthetic_batch, trl_args
from jaxcore.grpo import advantages as grpo
from jaxcore.grpo.config import GRPOConfig, GRPOOptions
from jaxcore.grpo.loss import grpo_loss
from jaxcore.grpo.step import loss_and_grads, policy_logps
from jaxcore.hf.mapping import params_to_hf
from torchref.model import load_reference

LOSS_REL_TOL = 1e-5
GRAD_REL_TOL = 1e-5
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def job(max_completion_length: int, temperature: float = 1.0, **grpo_settings) -> GRPOConfig:
    """A GRPO job config: the `grpo` section's settings, and TRL's max_completion_length and temperature
    (the rollout's max_new_tokens and temperature)."""
    cfg = GRPOConfig(grpo=GRPOOptions(**grpo_settings))
    cfg.rollout.max_new_tokens, cfg.rollout.temperature = max_completion_length, temperature
    cfg.validate()
    return cfg


def flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma3"])
def setup(request, tiny_dir):
    """Policy (jax + HF), and a batch whose old/ref log-probs differ from the policy's."""
    family = request.param
    path, ref_path = tiny_dir(family), tiny_dir(family, seed=1)
    model = jaxcore.load_hf(path)
    batch = synthetic_batch(model.config.vocab_size, 6, 7, 9, group_size=3, seed=3)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    score = nnx.jit(policy_logps)
    logp = np.asarray(score(model, ids, mask)[0])
    ref_logp = np.asarray(score(jaxcore.load_hf(ref_path), ids, mask)[0])
    noise = np.random.default_rng(0).normal(0, 0.3, logp.shape).astype(np.float32)
    old_logp = logp + noise * batch.completion_mask_BL       # equal at masked positions, as TRL would see
    batch = batch.replace(old_logp_BL=old_logp, ref_logp_BL=ref_logp)
    return family, model, load_reference(path), batch


@pytest.fixture(scope="module")
def policy_vjp(setup):
    """jaxcore's per-token log-probs and their pullback to the parameters (one compile per family)."""
    _, model, _, batch = setup
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    logp_fn = jax.jit(lambda p: policy_logps(nnx.merge(graphdef, p, rest), ids, mask)[0])
    logp, pullback = jax.vjp(logp_fn, nnx.to_pure_dict(params))
    return logp, jax.jit(pullback)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-12))


def torch_loss_and_grads(hf_model, batch, cfg) -> tuple[float, dict[str, float], dict[str, np.ndarray]]:
    hf_model.zero_grad(set_to_none=True)
    loss, metrics = tgrpo.batch_objective(hf_model, batch, trl_args(cfg))
    loss.backward()
    return loss.item(), metrics, {name: p.grad.numpy().copy() for name, p in hf_model.named_parameters()}


def compare(family: str, cfg, model, loss: float, metrics: dict, grads: dict, ref: tuple, *,
            clipped: bool = True) -> None:
    loss_t, metrics_t, grads_t = ref
    loss_err = abs(loss - loss_t) / abs(loss_t)
    ours = params_to_hf(model.config, flatten(grads))
    assert set(ours) == set(grads_t)
    grad_errs = {name: rel_err(ours[name], grads_t[name]) for name in grads_t}
    worst = max(grad_errs, key=grad_errs.get)
    print(f"{family} {cfg.grpo.loss_type} beta={cfg.grpo.beta}: loss {loss_t:+.6f} rel err {loss_err:.1e}; "
          f"max grad rel err {grad_errs[worst]:.1e} ({worst})")
    assert loss_err <= LOSS_REL_TOL
    assert grad_errs[worst] <= GRAD_REL_TOL
    assert all(np.abs(g).max() > 0 for g in grads_t.values())
    assert set(metrics_t) - {"entropy"} <= set(metrics)
    for key, value in metrics_t.items():
        if key not in metrics:
            continue
        # abs: two float32 ulps at 1.0. A metric such as policy_loss is a mean of O(1) terms (advantage x ratio) that
        # nearly cancel, so float32 rounding in either implementation leaves ~1e-7 however small the mean is.
        assert float(metrics[key]) == pytest.approx(value, rel=1e-5, abs=2.4e-7), key
    if clipped and "clip_ratio/region_mean" in metrics_t:
        assert metrics_t["clip_ratio/region_mean"] > 0  # the clipped branch is exercised
    if cfg.grpo.beta:
        assert metrics_t["kl"] > 0.01                    # the reference really differs


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_grads_match_torch(setup, policy_vjp, loss_type, beta):
    """grpo_loss on jaxcore log-probs, pulled back through the model, vs TRL's formulas on the HF model."""
    family, model, hf_model, batch = setup
    cfg = job(loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28, max_completion_length=9)
    logp, pullback = policy_vjp
    args = [None if x is None else jnp.asarray(x) for x in
            (batch.old_logp_BL, batch.ref_logp_BL, batch.advantages_B, batch.completion_mask_BL)]
    (loss, metrics), dloss_dlogp = jax.value_and_grad(
        lambda lp: grpo_loss(lp, *args, cfg.grpo, max_completion_length=cfg.rollout.max_new_tokens),
        has_aux=True)(logp)
    (grads,) = pullback(dloss_dlogp)
    compare(family, cfg, model, float(loss), metrics, grads, torch_loss_and_grads(hf_model, batch, cfg))


def test_train_objective_matches_torch(setup):
    """The train step's own objective (`loss_and_grads`: masking, temperature, truncation) end to end."""
    family, model, hf_model, batch = setup
    cfg = job(loss_type="dapo", beta=0.04, max_completion_length=9, temperature=0.7,
              mask_truncated_completions=True)
    assert batch.truncated_B.any() and not batch.truncated_B.all()
    loss, metrics, grads = loss_and_grads(model, batch, cfg)
    ref = torch_loss_and_grads(hf_model, batch, cfg)
    compare(family, cfg, model, float(loss), metrics, grads, ref)
    assert float(metrics["entropy"]) == pytest.approx(ref[1]["entropy"], rel=1e-5)


# Every TRL 1.16 option beyond the four original loss types, end to end through the model (the
# entropy options differentiate the entropy too). torchref.grpo transcribes TRL's `_compute_loss`.
OPTIONS = {
    "bias_kl_off": dict(loss_type="dapo", beta=0.04, use_bias_correction_kl=False),
    "sequence_grpo": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04, epsilon=0.05,
                          epsilon_high=0.05),
    "sequence_dapo": dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=0.05),
    "delta": dict(loss_type="grpo", delta=1.1, beta=0.04),
    "top_entropy": dict(loss_type="dapo", top_entropy_quantile=0.2),
    "entropy_coef": dict(loss_type="bnpo", entropy_coef=0.05, beta=0.04),
    "entropy_both": dict(loss_type="grpo", entropy_coef=0.05, top_entropy_quantile=0.5),
    "cispo": dict(loss_type="cispo", epsilon_high=1.1, beta=0.04),
    "sapo": dict(loss_type="sapo", beta=0.04),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=0.05),
    "vespo": dict(loss_type="vespo", beta=0.04),
    "off_policy_mask": dict(loss_type="dapo", off_policy_mask_threshold=0.0),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_trl_options_match_torch(setup, option):
    family, model, hf_model, batch = setup
    cfg = job(max_completion_length=9, **{"epsilon_high": 0.28, **OPTIONS[option]})
    loss, metrics, grads = loss_and_grads(model, batch, cfg)
    ref = torch_loss_and_grads(hf_model, batch, cfg)
    print(option, end=": ")
    compare(family, cfg, model, float(loss), metrics, grads, ref)


# TRL's default path with mu = 1 and steps_per_generation == gradient_accumulation_steps: no stored
# old log-probs, so old = logp.detach() and the ratio is 1 in value, but the bias-corrected KL
# kl * ratio still has the gradient kl * d logp (TRL 1.16 `_compute_loss`; jaxcore's learner stores no
# old_logp in that configuration either).
NO_OLD_LOGP = {
    "no_old_dapo": dict(loss_type="dapo", beta=0.04),
    "no_old_grpo": dict(loss_type="grpo", beta=0.04),
    "no_old_sequence": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
}


@pytest.mark.parametrize("option", list(NO_OLD_LOGP))
def test_bias_corrected_kl_without_old_logp_matches_torch(setup, option):
    family, model, hf_model, batch = setup
    batch = batch.replace(old_logp_BL=None)
    cfg = job(max_completion_length=9, epsilon_high=0.28, **NO_OLD_LOGP[option])
    assert cfg.grpo.use_bias_correction_kl                      # TRL's default
    loss, metrics, grads = loss_and_grads(model, batch, cfg)
    ref = torch_loss_and_grads(hf_model, batch, cfg)
    print(option, end=": ")
    compare(family, cfg, model, float(loss), metrics, grads, ref, clipped=False)
    # The correction's kl * d logp term is far above the tolerance, so dropping it (or detaching the
    # ratio) would fail the comparison above.
    plain_cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, use_bias_correction_kl=False))
    _, _, plain = loss_and_grads(model, batch, plain_cfg)
    ours, plain = flatten(grads), flatten(plain)
    shift = max(rel_err(plain[k], ours[k]) for k in ours)
    print(f"  bias-correction gradient share {shift:.1e}")
    assert shift > 100 * GRAD_REL_TOL


def test_dapo_global_normaliser_matches_torch(setup):
    """A micro-batch normalised by a larger (global) token count, as under accumulation/sharding."""
    _, model, hf_model, batch = setup
    cfg = job(loss_type="dapo", max_completion_length=9)
    logp = nnx.jit(policy_logps)(model, jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT))[0]
    args = (batch.old_logp_BL, batch.advantages_B, batch.completion_mask_BL)
    old, adv, mask = map(jnp.asarray, args)
    ours, _ = grpo_loss(logp, old, None, adv, mask, cfg.grpo, 1000.0, max_completion_length=cfg.rollout.max_new_tokens)
    old_t, adv_t, mask_t = (torch.tensor(np.array(x, np.float32)) for x in args)
    ref, _ = tgrpo.grpo_loss(torch.tensor(np.array(logp)), old_t, None, adv_t, mask_t, trl_args(cfg), 1000.0)
    assert float(ours) == pytest.approx(ref.item(), rel=1e-6)
    assert abs(ref.item()) > 0


REWARDS = {
    "accuracy": [1.0, 0.0, np.nan, 1.0, 0.5, 0.5, 0.5, np.nan, 0.0, 1.0, np.nan, 2.0],
    "format": [0.5, np.nan, np.nan, 0.0, 0.2, 0.2, 0.2, 1.0, 0.3, np.nan, np.nan, 0.1],
}


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [4, 3, 1])
def test_advantages_match_torch(scale, group_size):
    weights = {"accuracy": 1.0, "format": 0.5}
    ours = np.asarray(grpo.combine_rewards(REWARDS, weights))
    ref = tgrpo.combine_rewards(REWARDS, weights).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_allclose(ours[~np.isnan(ours)], ref[~np.isnan(ref)], rtol=1e-6)
    adv = np.asarray(grpo.compute_advantages(ours, group_size, scale))
    adv_ref = tgrpo.compute_advantages(torch.as_tensor(ref), group_size, scale).numpy()
    np.testing.assert_allclose(adv, adv_ref, rtol=1e-5, atol=1e-6)
    assert np.isfinite(adv).all() and adv[2] == 0.0 and adv[10] == 0.0      # unscorable rows
    if group_size > 1:
        assert np.abs(adv).max() > 0.1


@pytest.mark.parametrize("group_size", [4, 3, 2])
def test_normalize_then_sum_advantages_match_torch(group_size):
    """TRL's `multi_objective_aggregation="normalize_then_sum"`: each function normalized in its group, the
    weighted sum normalized over the batch; a function's None left out of its statistics."""
    weights = {"accuracy": 1.0, "format": 0.5}
    values_BK = np.stack([np.asarray(REWARDS[name], np.float32) for name in weights], axis=1)
    adv, zero_std = grpo.normalized_sum_advantages(values_BK, np.asarray(list(weights.values())), group_size)
    adv_ref, zero_std_ref = tgrpo.normalized_sum_advantages(REWARDS, weights, group_size)
    np.testing.assert_allclose(np.asarray(adv), adv_ref.numpy(), rtol=1e-5, atol=1e-6)
    assert float(zero_std) == zero_std_ref
    assert np.isfinite(adv).all() and adv[2] == 0.0 and adv[10] == 0.0 and np.abs(adv).max() > 0.1


def test_config_is_duck_typed():
    @dataclasses.dataclass
    class Plain:
        loss_type: str = "bnpo"
        epsilon: float = 0.2
        epsilon_high: float | None = None
        beta: float = 0.0
        max_completion_length: int = 4

    logp = jnp.log(jnp.asarray([[0.5, 0.25]]))
    loss, _ = grpo_loss(logp, None, None, jnp.asarray([1.0]), jnp.ones((1, 2)), Plain())
    ref, _ = tgrpo.grpo_loss(torch.log(torch.tensor([[0.5, 0.25]])), None, None, torch.tensor([1.0]),
                             torch.ones(1, 2), Plain())
    assert float(loss) == pytest.approx(ref.item()) == pytest.approx(-1.0)


@pytest.mark.parametrize("option", ["entropy_coef", "entropy_both", "sapo", "vespo", "cispo", "luspo"])
def test_accumulation_scaling_matches_torch(option):
    """One of 2 micro-batches (TRL's current_gradient_accumulation_steps = 2; dapo-like types use the
    step's token count): loss, d/dlogp and d/dentropy on random arrays."""
    rng = np.random.default_rng(1)
    b, t = 6, 8
    mask = (rng.random((b, t)) > 0.25).astype(np.float32)
    mask[:, 0] = 1
    old = -3 * rng.random((b, t)).astype(np.float32)
    logp = old + 0.3 * rng.normal(size=(b, t)).astype(np.float32)
    ref = old + 0.3 * rng.normal(size=(b, t)).astype(np.float32)
    entropy = 2 * rng.random((b, t)).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    cfg = job(max_completion_length=t, **{"epsilon_high": 0.28, "beta": 0.04, **OPTIONS[option]})
    items = float(mask.sum() * 1.7)

    def ours(lp, ent):
        return grpo_loss(lp, jnp.asarray(old), jnp.asarray(ref), jnp.asarray(adv), jnp.asarray(mask), cfg.grpo,
                         items, entropy_BT=ent, accumulation_steps=2,
                         max_completion_length=cfg.rollout.max_new_tokens)[0]

    loss, (g_lp, g_ent) = jax.value_and_grad(ours, argnums=(0, 1))(jnp.asarray(logp), jnp.asarray(entropy))
    lp_t, ent_t = torch.tensor(logp, requires_grad=True), torch.tensor(entropy, requires_grad=True)
    ref_loss, _ = tgrpo.grpo_loss(lp_t, torch.tensor(old), torch.tensor(ref), torch.tensor(adv), torch.tensor(mask),
                                  trl_args(cfg), items, entropy_BL=ent_t, accumulation_steps=2)
    ref_loss.backward()
    assert float(loss) == pytest.approx(ref_loss.item(), rel=1e-5)
    assert rel_err(np.asarray(g_lp), lp_t.grad.numpy()) <= GRAD_REL_TOL
    if ent_t.grad is not None:
        assert rel_err(np.asarray(g_ent), ent_t.grad.numpy()) <= GRAD_REL_TOL
