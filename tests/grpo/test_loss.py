"""Hand-worked GRPO numbers: reward combination, advantages, every loss type, metrics and gradients."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcore.grpo.advantages import combine_rewards, compute_advantages, reward_metrics
from jaxcore.grpo.config import GRPOLossConfig
from jaxcore.grpo.loss import grpo_loss, k3_kl

# --------------------------------------------------------------------------- rewards and advantages


def test_combine_rewards_is_nan_aware_weighted_sum():
    per_function = {"a": [1.0, np.nan, np.nan, 3.0], "b": [0.5, 2.0, np.nan, -1.0]}
    out = np.asarray(combine_rewards(per_function, {"a": 1.0, "b": 2.0}))
    np.testing.assert_allclose(out[[0, 1, 3]], [2.0, 4.0, 1.0])
    assert np.isnan(out[2])                               # no function scored it: unscorable
    np.testing.assert_allclose(np.asarray(combine_rewards(per_function, [0.0, 1.0]))[[0, 1, 3]], [0.5, 2.0, -1.0])
    with pytest.raises(ValueError):
        combine_rewards(per_function, [1.0])


def test_group_advantages_by_hand():
    rewards = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    adv = np.asarray(compute_advantages(rewards, 4, "group"))
    # group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.5773503; group 2: std 0 -> advantage 0
    a = 0.5 / (0.5773503 + 1e-4)
    np.testing.assert_allclose(adv, [a, -a, -a, a, 0, 0, 0, 0], rtol=1e-6)


def test_batch_and_none_scaling_by_hand():
    rewards = [1.0, 0.0, 3.0, 3.0]
    # per-group means 0.5 and 3.0; batch sample std of [1, 0, 3, 3] = sqrt(6.75 / 3) = 1.5
    np.testing.assert_allclose(np.asarray(compute_advantages(rewards, 2, "batch")),
                               np.array([0.5, -0.5, 0.0, 0.0]) / 1.5001, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(compute_advantages(rewards, 2, "none")), [0.5, -0.5, 0.0, 0.0])


def test_unscorable_rows_are_left_out_and_get_zero():
    adv = np.asarray(compute_advantages([1.0, np.nan, 0.0, 2.0], 4, "none"))
    np.testing.assert_allclose(adv, [0.0, 0.0, -1.0, 1.0])      # mean over the three scored rows is 1
    assert np.asarray(compute_advantages([np.nan] * 4, 4, "group")).tolist() == [0.0] * 4


def test_reward_metrics_by_hand():
    per_function = {"acc": [1.0, 0.0, 2.0, 2.0], "fmt": [np.nan, 1.0, np.nan, np.nan]}
    rewards = combine_rewards(per_function)                                  # [1, 1, 2, 2]
    m = reward_metrics(per_function, rewards, group_size=2)
    assert m["reward"] == pytest.approx(1.5) and m["reward_std"] == pytest.approx(math.sqrt(1 / 3))
    assert m["rewards/acc/mean"] == pytest.approx(1.25) and m["rewards/fmt/mean"] == 1.0
    assert m["frac_reward_zero_std"] == 1.0                                 # both groups constant
    assert reward_metrics(per_function, rewards, 4)["frac_reward_zero_std"] == 0.0


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_advantages_and_reward_std_of_rewards_near_float32s_limit(scale):
    """Finite rewards of ~1e20 (squares past float32's limit): the std is finite and the advantages those of a
    float64 computation (before: reward_std inf and every advantage 0); the reward std of small rewards is
    unchanged bit for bit (the same formula as TRL's)."""
    unit = np.array([1.0, 2.0, 4.0, 7.0, 0.0, 3.0, 3.0, 5.0])
    for factor in (1e20, 1e37):
        rewards = unit * factor
        groups = rewards.reshape(-1, 4)                 # the mean is the group's; the std the group's or the batch's
        std = np.repeat(groups.std(1, ddof=1), 4) if scale == "group" else rewards.std(ddof=1)
        expected = (rewards - np.repeat(groups.mean(1), 4)) / (std + 1e-4)
        np.testing.assert_allclose(np.asarray(compute_advantages(rewards, 4, scale)), expected, rtol=1e-5)
        metrics = reward_metrics({"r": rewards}, rewards, 4, scale)
        assert metrics["reward_std"] == pytest.approx(rewards.std(ddof=1), rel=1e-5)
    small = jnp.asarray(unit / 7.0, jnp.float32)
    dev = small - small.mean()
    assert reward_metrics({"r": small}, small, 4, scale)["reward_std"] == float(jnp.sqrt((dev * dev).sum() / 7))


def test_advantage_errors():
    with pytest.raises(ValueError):
        compute_advantages([1.0, 2.0, 3.0], 2, "group")
    with pytest.raises(ValueError):
        compute_advantages([1.0, 2.0], 2, "rank")


# --------------------------------------------------------------------------- the loss
# Two completions, three positions. Row 0: A = +1, ratios 1.5 (clipped high) and 0.9; row 1: A = -1,
# ratio 0.5 (clipped low). Masked positions hold junk that must not leak into anything.
MASK = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
OLD = jnp.log(jnp.asarray([[0.2, 0.5, 0.1], [0.4, 0.1, 0.1]]))
LOGP = OLD + jnp.log(jnp.asarray([[1.5, 0.9, 1.0], [0.5, 1.0, 1.0]]))
LOGP = jnp.where(MASK > 0, LOGP, jnp.asarray([[0.0, 0.0, -1e30], [0.0, 100.0, -100.0]]))
ADV = jnp.asarray([1.0, -1.0])
# per-token loss: row 0: -min(1.5, 1.2) = -1.2, -0.9; row 1: -min(-0.5, -0.8) = 0.8
EXPECTED = {"grpo": ((-1.2 - 0.9) / 2 + 0.8) / 2, "bnpo": (-2.1 + 0.8) / 3, "dr_grpo": -1.3 / (2 * 4),
            "dapo": -1.3 / 3}


@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_loss_types_by_hand(loss_type):
    cfg = GRPOLossConfig(loss_type=loss_type)
    loss, metrics = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg, max_completion_length=4)
    assert float(loss) == pytest.approx(EXPECTED[loss_type], rel=1e-6)
    assert float(metrics["clip_ratio/low_mean"]) == pytest.approx(1 / 3)
    assert float(metrics["clip_ratio/high_mean"]) == pytest.approx(1 / 3)
    assert float(metrics["clip_ratio/region_mean"]) == pytest.approx(2 / 3)
    assert "kl" not in metrics


def test_dr_grpo_needs_the_max_completion_length():
    with pytest.raises(ValueError, match="dr_grpo needs max_completion_length > 0"):
        grpo_loss(LOGP, OLD, None, ADV, MASK, GRPOLossConfig(loss_type="dr_grpo"))


def test_dapo_uses_the_global_token_count():
    cfg = GRPOLossConfig(loss_type="dapo")
    loss, _ = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg, num_items_in_batch=6)
    assert float(loss) == pytest.approx(-1.3 / 6, rel=1e-6)


def test_epsilon_high_widens_the_upper_clip():
    cfg = GRPOLossConfig(loss_type="bnpo", epsilon_high=0.6)       # 1.5 is now inside [0.8, 1.6]
    loss, metrics = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)
    assert float(loss) == pytest.approx((-1.5 - 0.9 + 0.8) / 3, rel=1e-6)
    assert float(metrics["clip_ratio/high_mean"]) == 0.0


def test_kl_term_by_hand():
    # ref - logp = ln 2, 0 on row 0 and -ln 2 on row 1: k3 = 2 - ln 2 - 1, 0, 0.5 + ln 2 - 1
    ref = LOGP + jnp.asarray([[math.log(2.0), 0.0, 5.0], [-math.log(2.0), 5.0, 5.0]])
    kl = [2 - math.log(2) - 1, 0.0, 0.5 + math.log(2) - 1]
    cfg = GRPOLossConfig(loss_type="grpo", beta=0.1, use_bias_correction_kl=False)
    loss, metrics = grpo_loss(LOGP, OLD, ref, ADV, MASK, cfg)
    expected = ((-1.2 + 0.1 * kl[0] - 0.9 + 0.1 * kl[1]) / 2 + (0.8 + 0.1 * kl[2])) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["kl"]) == pytest.approx(sum(kl) / 3, rel=1e-6)      # = 1/6
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)


def test_k3_is_zero_only_at_equality():
    assert float(k3_kl(jnp.asarray(-1.0), jnp.asarray(-1.0))) == 0.0
    assert float(k3_kl(jnp.asarray(-1.0), jnp.asarray(-2.0))) > 0


def test_gradient_by_hand_and_finite_under_junk():
    """d loss / d logp: clipped tokens get 0, the unclipped one -ratio * A / (2 tokens * 2 rows)."""
    cfg = GRPOLossConfig(loss_type="grpo")
    grad = np.asarray(jax.grad(lambda lp: grpo_loss(lp, OLD, None, ADV, MASK, cfg)[0])(LOGP))
    np.testing.assert_allclose(grad, [[0.0, -0.9 / 4, 0.0], [0.0, 0.0, 0.0]], atol=1e-7)


def test_old_logp_none_means_ratio_one():
    cfg = GRPOLossConfig(loss_type="bnpo")
    loss, metrics = grpo_loss(LOGP, None, None, ADV, MASK, cfg)
    assert float(loss) == pytest.approx((-1 - 1 + 1) / 3)                   # -sum(A) over tokens / 3
    grad = np.asarray(jax.grad(lambda lp: grpo_loss(lp, None, None, ADV, MASK, cfg)[0])(LOGP))
    np.testing.assert_allclose(grad, [[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]], atol=1e-7)
    assert float(metrics["clip_ratio/region_mean"]) == 0.0


def test_config_validation():
    with pytest.raises(ValueError, match="loss_type"):
        GRPOLossConfig(loss_type="ppo")
    with pytest.raises(ValueError):
        GRPOLossConfig(epsilon=-0.1)


# --------------------------------------------------------------------------- TRL 1.16's newer options, by hand


def test_bias_corrected_kl_by_hand():
    """The default: each token's k3 KL times its ratio (1.5, 0.9, 0.5), in the loss and the logged kl."""
    ref = LOGP + jnp.asarray([[math.log(2.0), 0.0, 5.0], [-math.log(2.0), 5.0, 5.0]])
    kl = [(2 - math.log(2) - 1) * 1.5, 0.0, (0.5 + math.log(2) - 1) * 0.5]
    loss, metrics = grpo_loss(LOGP, OLD, ref, ADV, MASK, GRPOLossConfig(loss_type="grpo", beta=0.1))
    expected = ((-1.2 + 0.1 * kl[0] - 0.9 + 0.1 * kl[1]) / 2 + (0.8 + 0.1 * kl[2])) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["kl"]) == pytest.approx(sum(kl) / 3, rel=1e-6)


def test_sequence_level_ratio_by_hand():
    """GSPO: row 0's ratio is exp(mean(log 1.5, log 0.9)) = sqrt(1.35), inside the clip range."""
    cfg = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence")
    loss, metrics = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)
    assert float(loss) == pytest.approx((-math.sqrt(1.35) + 0.8) / 2, rel=1e-6)
    assert float(metrics["clip_ratio/low_mean"]) == pytest.approx(0.5)      # one of two rows


def test_delta_caps_the_unclipped_branch():
    cfg = GRPOLossConfig(loss_type="grpo", epsilon_high=0.6, delta=1.3)     # 1.5 -> 1.3, inside [0.8, 1.6]
    loss, _ = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)
    assert float(loss) == pytest.approx(((-1.3 - 0.9) / 2 + 0.8) / 2, rel=1e-6)


def test_sapo_soft_gate_by_hand():
    def gate(r: float, t: float) -> float:
        return 4.0 / t / (1.0 + math.exp(-t * (r - 1.0)))

    loss, metrics = grpo_loss(LOGP, OLD, None, ADV, MASK, GRPOLossConfig(loss_type="sapo"))
    expected = ((-gate(1.5, 1.0) - gate(0.9, 1.0)) / 2 + gate(0.5, 1.05)) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert "clip_ratio/region_mean" not in metrics


def test_cispo_gradient_is_the_capped_ratio():
    """d loss / d logp = -min(ratio, epsilon_high) * A / tokens (the ratio is detached)."""
    cfg = GRPOLossConfig(loss_type="cispo", epsilon_high=1.2)
    grad = np.asarray(jax.grad(lambda lp: grpo_loss(lp, OLD, None, ADV, MASK, cfg)[0])(LOGP))
    np.testing.assert_allclose(grad, [[-1.2 / 3, -0.9 / 3, 0.0], [0.5 / 3, 0.0, 0.0]], atol=1e-7)
    assert float(grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)[1]["cispo_clip_ratio"]) == pytest.approx(1 / 3)


def test_entropy_mask_and_bonus():
    """top_entropy_quantile 0.5 keeps tokens at or above the median active entropy (1.0 and 2.0 of
    0.5, 1.0, 2.0); the bonus is the mean entropy over those same tokens."""
    entropy = jnp.asarray([[0.5, 2.0, 9.0], [1.0, 9.0, 9.0]])
    cfg = GRPOLossConfig(loss_type="bnpo", top_entropy_quantile=0.5, entropy_coef=0.1)
    loss, metrics = grpo_loss(LOGP, OLD, None, ADV, MASK, cfg, entropy_BT=entropy)
    policy = (-0.9 + 0.8) / 3
    assert float(metrics["policy_loss"]) == pytest.approx(policy, rel=1e-6)
    assert float(loss) == pytest.approx(policy - 0.1 * 1.5, rel=1e-6)
    with pytest.raises(ValueError, match="entropy_BT"):
        grpo_loss(LOGP, OLD, None, ADV, MASK, cfg)


def test_new_option_validation():
    for bad in (dict(importance_sampling_level="group"), dict(top_entropy_quantile=1.5), dict(delta=0.0),
                dict(loss_type="sapo", sapo_temperature_neg=0.0)):
        with pytest.raises(ValueError):
            GRPOLossConfig(**bad)


def test_a_loss_type_is_one_registry_entry(monkeypatch):
    """A type added to `LOSS_KINDS` (here from the test) is taken by the loss as is: its term, its reduction, and
    the clip metrics only when it clips; docs/grpo.md's table is the registry's."""
    from pathlib import Path

    from jaxcore.grpo import loss_types

    def doubled(logp_BT, ratio, log_ratio_BT, advantages_B1, mask_BT, cfg):
        return -2.0 * ratio * advantages_B1, ratio, {"doubled": jnp.ones_like(ratio)}

    monkeypatch.setitem(loss_types.LOSS_KINDS, "doubled", loss_types.LossKind(
        doubled, loss_types.row_sum_mean, False, "twice the ratio times A, per-sequence sums"))
    cfg = GRPOLossConfig(loss_type="grpo")
    object.__setattr__(cfg, "loss_type", "doubled")       # the config's literal was made before this entry
    logp_BT = jnp.zeros((2, 3))
    mask_BT = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
    loss, metrics = grpo_loss(logp_BT, None, None, jnp.array([1.0, -0.5]), mask_BT, cfg)
    assert float(loss) == pytest.approx(-(2.0 * 2 * 1.0 + 2.0 * 3 * -0.5) / 2)     # rows' sums, then their mean
    assert "doubled" in metrics and not any(k.startswith("clip_ratio") for k in metrics)
    readme = (Path(__file__).resolve().parents[2] / "docs" / "grpo.md").read_text()
    monkeypatch.delitem(loss_types.LOSS_KINDS, "doubled")
    assert loss_types.loss_types_markdown() in readme
    with pytest.raises(ValueError, match="unknown loss_type 'nope'"):
        loss_types.loss_kind("nope")


@pytest.mark.parametrize("loss_type", ["sapo", "vespo", "dapo"])
def test_a_duck_typed_config_is_read_with_trls_defaults(loss_type):
    """The loss takes any object with the loss settings' names (TRL's flat config): a setting it lacks (the
    sapo/vespo parameters, delta, the entropy options) is GRPOLossConfig's default, so the loss is the config's."""
    import types

    duck = types.SimpleNamespace(loss_type=loss_type, beta=0.0, epsilon=0.2, epsilon_high=0.28)
    ours = grpo_loss(LOGP, OLD, None, ADV, MASK, GRPOLossConfig(loss_type=loss_type, epsilon_high=0.28))
    theirs = grpo_loss(LOGP, OLD, None, ADV, MASK, duck)
    np.testing.assert_allclose(float(theirs[0]), float(ours[0]), rtol=1e-6)
    assert set(theirs[1]) == set(ours[1])
