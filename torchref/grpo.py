"""The GRPO reference in PyTorch, written the way TRL's GRPOTrainer computes it, on the HF model.

Takes the same batch layout as `jaxcore.grpo.step.GRPOBatch` (any object with its attribute names):
`input_ids_BT`, `attention_mask_BT`, per-token arrays over L = T - 1 positions (position t scores
token t + 1), `advantages_B`, `truncated_B`, optional `old_logp_BL` / `ref_logp_BL`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchref.model import hf_position_ids

STD_EPS = 1e-4


def _tensor(x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return x.to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(np.array(x), dtype=dtype)


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's `nanstd`: sample std (Bessel-corrected) ignoring NaNs, NaN below two values."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def combine_rewards(per_function: Mapping[str, Any], weights: Mapping[str, float] | Sequence[float] | None = None
                    ) -> torch.Tensor:
    """`nansum(rewards_per_func * weights)`; rows no function scored are NaN (TRL's unscorable rows)."""
    names = list(per_function)
    rewards_BF = torch.stack([_tensor(per_function[n]) for n in names], dim=1)
    if weights is None:
        w_F = torch.ones(len(names))
    else:
        w_F = _tensor([weights[n] for n in names] if isinstance(weights, Mapping) else list(weights))
    rewards_B = (rewards_BF * w_F.unsqueeze(0)).nansum(dim=1)
    rewards_B[torch.isnan(rewards_BF).all(dim=1)] = torch.nan
    return rewards_B


def compute_advantages(rewards_B: Any, group_size: int, scale: str = "group") -> torch.Tensor:
    """TRL's `sum_then_normalize` advantages for `scale_rewards` in group / batch / none."""
    rewards_B = _tensor(rewards_B)
    mean_B = torch.nanmean(rewards_B.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
    if scale in ("group", "none"):
        if group_size > 1:
            std_B = nanstd(rewards_B.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
        else:
            std_B = torch.zeros_like(rewards_B)
    elif scale == "batch":
        std_B = nanstd(rewards_B).expand_as(rewards_B) if rewards_B.numel() > 1 else torch.zeros_like(rewards_B)
    else:
        raise ValueError(f"unknown scale {scale!r}")
    advantages_B = rewards_B - mean_B
    if scale != "none":
        advantages_B = advantages_B / (std_B + STD_EPS)
    return torch.nan_to_num(advantages_B, nan=0.0)


def normalized_sum_advantages(per_function: Mapping[str, Any], weights: Mapping[str, float], group_size: int
                              ) -> tuple[torch.Tensor, float]:
    """TRL's `normalize_then_sum` advantages (and its frac_reward_zero_std), transcribed from its GRPOTrainer."""
    names = list(per_function)
    rewards_per_func = torch.stack([_tensor(per_function[n]) for n in names], dim=1)
    reward_weights = _tensor([weights[n] for n in names])
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, group_size, len(names))
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1).unsqueeze(1) if group_size > 1 else torch.zeros_like(mean_k)
    reward_k = ((grouped - mean_k) / (std_k + STD_EPS)).view(-1, len(names))
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + STD_EPS)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    return torch.nan_to_num(advantages, nan=0.0), float(is_std_zero.float().mean())


TRL_DEFAULTS = {"use_bias_correction_kl": True, "importance_sampling_level": "token", "delta": None,
                "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "off_policy_mask_threshold": None,
                "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "vespo_k_pos": 2.0,
                "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}


def _opt(cfg: Any, name: str) -> Any:
    return getattr(cfg, name, TRL_DEFAULTS[name])


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL's `get_high_entropy_mask` on one process: entropy >= the `threshold` quantile of active tokens."""
    local = entropies[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(local, threshold)
    return ((entropies * mask.float()) >= entropy_threshold) & mask.bool()


@torch.no_grad()
def gamma_weights(advantages: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, cfg: Any) -> torch.Tensor:
    """TRL's `get_gamma_weights` (VESPO) without vLLM importance-sampling ratios: [B, 1]."""
    lower_clamp = math.log(1e-8)
    seq_log_ratio = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    nonneg = advantages >= 0
    k_seq = torch.where(nonneg, _opt(cfg, "vespo_k_pos"), _opt(cfg, "vespo_k_neg"))
    lambda_seq = torch.where(nonneg, _opt(cfg, "vespo_lambda_pos"), _opt(cfg, "vespo_lambda_neg")).clamp(min=1e-4)
    log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def grpo_loss(logp_BL: torch.Tensor, old_logp_BL: torch.Tensor | None, ref_logp_BL: torch.Tensor | None,
              advantages_B: torch.Tensor, mask_BL: torch.Tensor, cfg: Any,
              num_items_in_batch: torch.Tensor | float | None = None, *, entropy_BL: torch.Tensor | None = None,
              accumulation_steps: int = 1) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL 1.16's `_compute_loss` after the forward, on one process without vLLM: every loss type,
    token/sequence importance sampling, delta, the bias-corrected KL, the entropy mask and bonus, and
    the off-policy mask. `accumulation_steps` plays `current_gradient_accumulation_steps`, and
    `num_items_in_batch` the step's token count (TRL's normaliser after its rescaling)."""
    mask = mask_BL.float()
    loss_type, beta = cfg.loss_type, cfg.beta
    eps_low = cfg.epsilon
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    quantile = _opt(cfg, "top_entropy_quantile")
    entropy_mask = high_entropy_mask(entropy_BL, mask, 1 - quantile) if quantile < 1.0 else None
    advantages = advantages_B.unsqueeze(1)
    old_logp_BL = logp_BL.detach() if old_logp_BL is None else old_logp_BL
    threshold = _opt(cfg, "off_policy_mask_threshold")
    if threshold is not None:
        kl_div = torch.nan_to_num(old_logp_BL - logp_BL.detach(), nan=0.0)
        avg_seq_kl = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((advantages >= 0) | (avg_seq_kl <= threshold)).to(mask.dtype)

    log_ratio = logp_BL - old_logp_BL
    if _opt(cfg, "importance_sampling_level") == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        per_token_kl = torch.exp(ref_logp_BL - logp_BL) - (ref_logp_BL - logp_BL) - 1
        if _opt(cfg, "use_bias_correction_kl"):
            per_token_kl = per_token_kl * coef_1

    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=eps_high).detach()
        per_token_loss = -clamped_ratios * advantages * logp_BL
    elif loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if _opt(cfg, "delta") is not None:
            coef_1 = torch.clamp(coef_1, max=_opt(cfg, "delta"))
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, _opt(cfg, "sapo_temperature_pos"), _opt(cfg, "sapo_temperature_neg"))
        per_token_loss = -torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures * advantages
    elif loss_type == "vespo":
        phi_seq = gamma_weights(advantages, log_ratio, mask, cfg)
        per_token_loss = -phi_seq * advantages * logp_BL
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")
    if threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl

    n = accumulation_steps
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * cfg.max_completion_length)
    elif loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    else:   # cispo, dapo, vespo
        items = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=torch.float32)
        loss = (per_token_loss * mask).sum() / items.clamp(min=1.0)
        n = 1
    policy_loss = loss.detach()
    loss = loss / n
    metrics = {}
    if _opt(cfg, "entropy_coef") != 0.0:
        effective_mask = mask if entropy_mask is None else mask * entropy_mask
        entropy_loss = (entropy_BL * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation_steps
        loss = loss - _opt(cfg, "entropy_coef") * entropy_loss
        metrics["policy_loss"] = float(policy_loss)

    def masked_mean(x: torch.Tensor) -> float:
        if x.shape[1] == 1:
            return float(x.sum() / x.shape[0])
        return float((x * mask).sum() / mask.sum().clamp(min=1.0))

    def masked_seq_mean(x: torch.Tensor) -> torch.Tensor:      # TRL's: one value per row
        if x.shape[1] == 1:
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)

    if beta != 0.0:
        metrics["kl"] = masked_mean(per_token_kl.detach())
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        is_low = ((coef_1 < 1 - eps_low) & (advantages < 0)).float()
        is_high = ((coef_1 > 1 + eps_high) & (advantages > 0)).float()
        metrics["clip_ratio/low_mean"] = masked_mean(is_low)
        metrics["clip_ratio/high_mean"] = masked_mean(is_high)
        metrics["clip_ratio/region_mean"] = masked_mean(torch.maximum(is_low, is_high))
        metrics["clip_ratio/low_min"] = float(torch.nanquantile(masked_seq_mean(is_low), 0.0))   # TRL's nanmin
        metrics["clip_ratio/high_max"] = float(torch.nanquantile(masked_seq_mean(is_high), 1.0))  # TRL's nanmax
    elif loss_type == "cispo":
        metrics["cispo_clip_ratio"] = masked_mean(((coef_1 > eps_high) & (advantages > 0)).float())
    elif loss_type == "vespo":
        metrics["vespo/phi_seq_mean"] = masked_mean(phi_seq)
    return loss, metrics


def policy_logps(model: Any, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temperature: float = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs and entropies [B, T-1] (both differentiable, as TRL's) of the HF model."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, use_cache=False,
                       position_ids=hf_position_ids(attention_mask_BT)).logits
    logits_BLV = logits_BTV[:, :-1].float() / temperature
    logp_BLV = torch.log_softmax(logits_BLV, dim=-1)
    logp_BL = logp_BLV.gather(-1, input_ids_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy_BL = -(logp_BLV.exp() * logp_BLV).sum(-1)
    return logp_BL, entropy_BL


def batch_objective(model: Any, batch: Any, cfg: Any, num_items_in_batch: float | None = None
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of one batch under the HF `model` (differentiable), with metrics incl. entropy."""
    device = next(model.parameters()).device

    def tensor(x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _tensor(x, dtype).to(device)

    ids = tensor(batch.input_ids_BT, torch.long)
    attention = tensor(batch.attention_mask_BT, torch.long)
    mask_BL = tensor(batch.completion_mask_BL)
    if getattr(cfg, "mask_truncated_completions", False):
        mask_BL = mask_BL * (~tensor(batch.truncated_B, torch.bool)).float().unsqueeze(1)
    logp_BL, entropy_BL = policy_logps(model, ids, attention, getattr(cfg, "temperature", 1.0))
    old = None if batch.old_logp_BL is None else tensor(batch.old_logp_BL)
    ref = None if cfg.beta == 0.0 else tensor(batch.ref_logp_BL)
    loss, metrics = grpo_loss(logp_BL, old, ref, tensor(batch.advantages_B), mask_BL, cfg, num_items_in_batch,
                              entropy_BL=entropy_BL)
    metrics["entropy"] = float((entropy_BL.detach() * mask_BL).sum() / mask_BL.sum().clamp(min=1.0))
    return loss, metrics
