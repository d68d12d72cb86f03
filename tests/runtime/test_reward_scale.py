"""Rewards and fitness of any finite size (`jaxcore.runtime.reward_scale`): each group's statistics are taken in its
own power of two, so one huge reward changes no other group (issue 49, item 1)."""

import numpy as np
import pytest

from jaxcore.grpo.advantages import compute_advantages, normalized_sum_advantages, reward_std

G = 8
HUGE = [1e30, 1e34, 3e38]


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
