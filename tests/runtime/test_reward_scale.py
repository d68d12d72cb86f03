"""Rewards and fitness of any finite size (`jaxcore.runtime.reward_scale`): each group's statistics are taken in its
own power of two, so one huge reward changes no other group, and a constant group is exactly 0 at every magnitude,
for every scale_rewards and fitness shaping (issue 49, items 1 and 2)."""

import numpy as np
import pytest

from jaxcore.es.shaping import SHAPERS, shape_fitness
from jaxcore.grpo.advantages import compute_advantages, normalized_sum_advantages, reward_metrics, reward_std

G = 8
HUGE = [1e30, 1e34, 3e38]
MAGNITUDES = [m * 10.0 ** k for k in range(-30, 39) for m in (1, 3) if m * 10.0 ** k < 3.4e38]  # 1e-30 .. 3e38


def ordinary_groups() -> np.ndarray:
    """Seven groups of G: four of 0/1 rewards, three of rewards ~1e-6."""
    rng = np.random.default_rng(0)
    binary = rng.integers(0, 2, size=(4, G)).astype(np.float64)
    binary[:, :2] = [0.0, 1.0]                                          # no group constant
    return np.concatenate([binary, rng.uniform(0, 2e-6, size=(3, G))]).reshape(-1).astype(np.float32)


def trl_advantages(rewards: np.ndarray, scale: str) -> np.ndarray:
    """TRL's (r - group mean) / (std + 1e-4) in float64."""
    rewards_NG = np.asarray(rewards, np.float64).reshape(-1, G)
    centred_NG = rewards_NG - rewards_NG.mean(1, keepdims=True)
    if scale == "none":
        return centred_NG.reshape(-1)
    std = rewards_NG.std(1, ddof=1, keepdims=True) if scale == "group" else rewards_NG.std(ddof=1)
    return (centred_NG / (std + 1e-4)).reshape(-1)


@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("huge", HUGE)
def test_one_huge_reward_leaves_every_other_group_alone(huge, scale):
    """[X, 0 x 7] beside seven ordinary groups: their advantages and stds are, bit for bit, those they have alone
    (TRL's numbers). Before, the power of two was the batch's: from 1e34 the 0/1 groups' deviations squared to 0
    and max|A| was 7500 (TRL: 1.6), and from 1e30 the 1e-6 groups were off by 5e-3."""
    ordinary = ordinary_groups()
    rewards = np.concatenate([np.asarray([huge] + [0.0] * (G - 1), np.float32), ordinary])
    advantages = np.asarray(compute_advantages(rewards, G, scale))
    np.testing.assert_array_equal(advantages[G:], np.asarray(compute_advantages(ordinary, G, scale)))
    np.testing.assert_allclose(advantages, trl_advantages(rewards, scale), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(reward_std(rewards, G, scale))[G:],
                                  np.asarray(reward_std(ordinary, G, scale)))


@pytest.mark.parametrize("huge", HUGE)
def test_one_huge_reward_under_batch_scaling_is_trls(huge):
    """scale_rewards=batch divides by the batch's std: every group's deviation from its own mean, over it."""
    rewards = np.concatenate([np.asarray([huge] + [0.0] * (G - 1), np.float32), ordinary_groups()])
    expected = trl_advantages(rewards, "batch")
    np.testing.assert_allclose(compute_advantages(rewards, G, "batch"), expected, rtol=1e-5, atol=1e-37)


@pytest.mark.parametrize("huge", HUGE)
def test_one_huge_reward_leaves_every_other_group_alone_in_normalize_then_sum(huge):
    """normalize_then_sum normalizes each function within each group (its own power of two), then the sum over the
    batch: the float64 formula's numbers."""
    first = np.concatenate([np.asarray([huge] + [0.0] * (G - 1), np.float32), ordinary_groups()])
    second = np.random.default_rng(1).uniform(0, 2e-6, size=first.shape).astype(np.float32)
    values_BK, weights_K = np.stack([first, second], 1), np.asarray([1.0, 0.5], np.float32)
    grouped_NGK = values_BK.astype(np.float64).reshape(-1, G, 2)
    normalized_NGK = ((grouped_NGK - grouped_NGK.mean(1, keepdims=True))
                      / (grouped_NGK.std(1, ddof=1, keepdims=True) + 1e-4))
    summed_B = (normalized_NGK * weights_K).sum(2).reshape(-1)
    expected = (summed_B - summed_B.mean()) / (summed_B.std(ddof=1) + 1e-4)
    advantages, _ = normalized_sum_advantages(values_BK, weights_K, G)
    np.testing.assert_allclose(np.asarray(advantages), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_constant_group_has_zero_advantage_at_every_magnitude(scale):
    """Eight equal rewards, from 1e-30 to 3e38, beside an ordinary group: advantage and std exactly 0 (before: the
    mean of eight 1e30s rounded by an ulp of their unit, and A was +-0.935 at 1e30, 3e31 and 1e36; below 2**50 too,
    at 3e9 say, as TRL's float32 formula still gives). Under batch scaling a batch of equal rewards too."""
    ordinary = ordinary_groups()[:G]
    for magnitude in MAGNITUDES:
        constant = np.full(G, magnitude, np.float32)
        rewards = np.concatenate([constant, ordinary])
        assert not np.asarray(compute_advantages(rewards, G, scale))[:G].any(), magnitude
        assert not np.asarray(compute_advantages(constant, G, scale)).any(), magnitude
        if scale != "batch":
            assert not np.asarray(reward_std(rewards, G, scale))[:G].any(), magnitude
            assert reward_metrics({"r": rewards}, rewards, G, scale)["frac_reward_zero_std"] == 0.5, magnitude


def test_a_constant_reward_function_adds_nothing_to_normalize_then_sum_at_every_magnitude():
    """A function that gives every row the same reward normalizes to exactly 0 in each group: the advantages are
    those of the other function alone, bit for bit, and a batch of equal rewards gets 0."""
    ordinary = ordinary_groups()
    alone, _ = normalized_sum_advantages(ordinary[:, None], np.ones(1, np.float32), G)
    for magnitude in MAGNITUDES:
        constant = np.full(ordinary.shape, magnitude, np.float32)
        both, _ = normalized_sum_advantages(np.stack([constant, ordinary], 1), np.ones(2, np.float32), G)
        np.testing.assert_array_equal(np.asarray(both), np.asarray(alone), err_msg=str(magnitude))
        only, zero_std = normalized_sum_advantages(constant[:, None], np.ones(1, np.float32), G)
        assert not np.asarray(only).any() and float(zero_std) == 1.0, magnitude


@pytest.mark.parametrize("mode", [mode for mode in SHAPERS if mode != "none"])
def test_constant_fitness_gives_zero_z_at_every_magnitude(mode):
    """A population of equal fitness, from 1e-30 to 3e38, shapes to z = 0 exactly: no update (before: 1e30 gave
    z = +1 for every member, a full random step, 3e31 z = -1, and from 1e33 z was NaN). With group_zscore a
    constant group beside a varied one is 0 too. ("none" passes fitness through unshaped.)"""
    varied = np.asarray([0.0, 1.0, 3.0, 2.0], np.float32)
    for magnitude in MAGNITUDES:
        constant = np.full(8, magnitude, np.float32)
        z = np.asarray(shape_fitness(constant, mode, group_size=4))
        assert np.isfinite(z).all() and not z.any(), (magnitude, z)
        mixed = np.asarray(shape_fitness(np.concatenate([constant[:4], varied]), mode, group_size=4))
        assert np.isfinite(mixed).all(), magnitude
        if mode == "group_zscore":
            assert not mixed[:4].any(), (magnitude, mixed)
