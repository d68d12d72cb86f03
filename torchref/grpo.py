"""The GRPO reference in PyTorch, written the way TRL's GRPOTrainer computes it, on the HF model.

Takes the same batch layout as `jaxcore.grpo_step.GRPOBatch` (any object with its attribute names):
`input_ids_BT`, `attention_mask_BT`, per-token arrays over L = T - 1 positions (position t scores
token t + 1), `advantages_B`, `truncated_B`, optional `old_logp_BL` / `ref_logp_BL`.
"""

from __future__ import annotations

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


def grpo_loss(logp_BL: torch.Tensor, old_logp_BL: torch.Tensor | None, ref_logp_BL: torch.Tensor | None,
              advantages_B: torch.Tensor, mask_BL: torch.Tensor, cfg: Any,
              num_items_in_batch: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's `_compute_loss` for token-level importance sampling and loss types grpo/bnpo/dr_grpo/dapo."""
    mask_BL = mask_BL.float()
    old_logp_BL = logp_BL.detach() if old_logp_BL is None else old_logp_BL
    eps_low = cfg.epsilon
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    advantages_B1 = advantages_B.unsqueeze(1)
    coef_1 = torch.exp(logp_BL - old_logp_BL)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages_B1, coef_2 * advantages_B1)
    if cfg.beta != 0.0:
        per_token_kl = torch.exp(ref_logp_BL - logp_BL) - (ref_logp_BL - logp_BL) - 1
        per_token_loss = per_token_loss + cfg.beta * per_token_kl
    if cfg.loss_type == "grpo":
        loss = ((per_token_loss * mask_BL).sum(-1) / mask_BL.sum(-1).clamp(min=1.0)).mean()
    elif cfg.loss_type == "bnpo":
        loss = (per_token_loss * mask_BL).sum() / mask_BL.sum().clamp(min=1.0)
    elif cfg.loss_type == "dr_grpo":
        loss = (per_token_loss * mask_BL).sum() / (per_token_loss.size(0) * cfg.max_completion_length)
    elif cfg.loss_type == "dapo":
        n = mask_BL.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=torch.float32)
        loss = (per_token_loss * mask_BL).sum() / n.clamp(min=1.0)
    else:
        raise ValueError(f"unknown loss_type {cfg.loss_type!r}")

    def masked_mean(x: torch.Tensor) -> float:
        return float((x * mask_BL).sum() / mask_BL.sum().clamp(min=1.0))

    metrics = {}
    if cfg.beta != 0.0:
        metrics["kl"] = masked_mean(per_token_kl.detach())
    is_low = ((coef_1 < 1 - eps_low) & (advantages_B1 < 0)).float()
    is_high = ((coef_1 > 1 + eps_high) & (advantages_B1 > 0)).float()
    metrics["clip_ratio/low_mean"] = masked_mean(is_low)
    metrics["clip_ratio/high_mean"] = masked_mean(is_high)
    metrics["clip_ratio/region_mean"] = masked_mean(torch.maximum(is_low, is_high))
    return loss, metrics


def policy_logps(model: Any, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temperature: float = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs [B, T-1] (differentiable) and entropies [B, T-1] (no grad) of the HF model."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, use_cache=False,
                       position_ids=hf_position_ids(attention_mask_BT)).logits
    logits_BLV = logits_BTV[:, :-1].float() / temperature
    logp_BLV = torch.log_softmax(logits_BLV, dim=-1)
    logp_BL = logp_BLV.gather(-1, input_ids_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
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
    loss, metrics = grpo_loss(logp_BL, old, ref, tensor(batch.advantages_B), mask_BL, cfg, num_items_in_batch)
    metrics["entropy"] = float((entropy_BL * mask_BL).sum() / mask_BL.sum().clamp(min=1.0))
    return loss, metrics
