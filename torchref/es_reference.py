"""An independent torch reference for one EGGROLL epoch: materialised member weights, the HF model per
member, and the ES update from the materialised noise.

Why it is independent of jaxcore's ES code: from jaxcore it takes only the raw random draws, i.e. the
unit-Gaussian arrays of `jaxcore.es.eggroll.pair_factors(plan, epoch, arange(N // 2))` (per perturbed
jaxcore path, pair p's unscaled `AB [P, in + out, r]` for a matrix, `eps [P, ...]` for a vector), and
the jaxcore-path -> HF-tensor names of `jaxcore.hf.mapping.tensor_maps` (the layout the model parity
tests check). Everything else is written here from docs/design.md ("EGGROLL"), not from
jaxcore's code: member i uses pair i // 2 with sign +1 (even i) or -1 (odd i); `A = AB[:in]`,
`B = AB[in:]`; `E_i = sign_i * A @ B.T / sqrt(r)` (or `sign_i * eps` for a vector); each member's
full weight `W_i = W + sigma * E_i` is formed as a dense tensor in the HF layout (its orientation taken
from the HF module: `nn.Linear` [out, in], GPT-2 `Conv1D` [in, out], `nn.Embedding` [rows, dim]) and
loaded into a copy of the HF model, which then runs unmodified (no hooks); and the update is
`g = 1/(N * sigma) * sum_i f_i * (W_i - W)` with f the shaped fitness, applied by `torch.optim`.
No stand-ins, factor folding, pair-difference or einsum trick of jaxcore is reused.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from transformers.pytorch_utils import Conv1D

from jaxcore.hf.mapping import tensor_maps
from jaxcore.model.config import ModelConfig
from torchref.model import reference_logits


def _placement(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """jaxcore path -> (HF tensor name, slot among the tensor's fused parts, number of parts)."""
    return {path: (m.hf_key, slot, len(m.jax_paths)) for m in tensor_maps(cfg) for slot, path in enumerate(m.jax_paths)}


def _in_out(module: Any, weight: torch.Tensor, parts: int) -> tuple[int, int, bool]:
    """(in, out, transposed) of one of the `parts` matrices fused in `weight`, from the HF module's layout:
    `nn.Linear` holds [out, in] (y = x @ weight.T); GPT-2's `Conv1D` [in, parts * out] (y = x @ weight);
    `nn.Embedding` [rows, dim] (a row lookup, the rows playing `in`)."""
    if isinstance(module, torch.nn.Linear) and parts == 1:
        return weight.shape[1], weight.shape[0], True
    if isinstance(module, (Conv1D, torch.nn.Embedding)):
        return weight.shape[0], weight.shape[1] // parts, False
    raise TypeError(f"no known weight layout for {type(module).__name__} with {parts} fused parts")


def materialise_noise(hf_model: Any, cfg: ModelConfig, raw: Mapping[str, Any], population: int, sigma: float,
                      rank: int) -> list[dict[str, torch.Tensor]]:
    """Every member's full perturbation `sigma * E_i` as dense float64 tensors, keyed and shaped like the
    HF model's parameters (a fused tensor gets its perturbed parts in their slices, zeros elsewhere).

    `raw[path]` is the jaxcore draw for that path over the N/2 antithetic pairs: `AB [P, in + out, r]`
    for a matrix, `eps [P, ...]` for a vector (unit Gaussian, nothing applied to it).
    """
    if population % 2:
        raise ValueError(f"antithetic pairs need an even population, got {population}")
    params = dict(hf_model.named_parameters())
    placement = _placement(cfg)
    members: list[dict[str, torch.Tensor]] = []
    for i in range(population):
        pair, sign = i // 2, (1.0 if i % 2 == 0 else -1.0)
        deltas: dict[str, torch.Tensor] = {}
        for path, draws in raw.items():
            draw = torch.from_numpy(np.array(draws, np.float64))[pair]
            hf_key, slot, parts = placement[path]
            target = params[hf_key]
            if target.ndim == 2:                                    # a matrix: low-rank noise
                n_in, n_out, transposed = _in_out(hf_model.get_submodule(hf_key.rsplit(".", 1)[0]), target, parts)
                if draw.shape != (n_in + n_out, rank):
                    raise ValueError(f"{path}: draw {tuple(draw.shape)}, expected {(n_in + n_out, rank)}")
                a_IR, b_OR = draw[:n_in], draw[n_in:]
                e = sign * (a_IR @ b_OR.T) / math.sqrt(rank)        # [in, out], unit variance per entry
                e = e.T if transposed else e
            else:                                                   # a vector: full-rank noise
                e = sign * draw
            full = deltas.setdefault(hf_key, torch.zeros(target.shape, dtype=torch.float64))
            width = target.shape[-1] // parts
            piece = full[..., slot * width:(slot + 1) * width]
            if piece.shape != e.shape:
                raise ValueError(f"{path} -> {hf_key}[{slot}]: noise {tuple(e.shape)}, slot {tuple(piece.shape)}")
            piece += sigma * e
        members.append(deltas)
    return members


def member_weights(hf_model: Any, deltas: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Member i's perturbed tensors `W_i = W + sigma * E_i` (float64)."""
    params = dict(hf_model.named_parameters())
    return {key: params[key].detach().double() + delta for key, delta in deltas.items()}


def population_logits(hf_model: Any, members: list[dict[str, torch.Tensor]], input_ids_BT: np.ndarray,
                      attention_mask_BT: np.ndarray) -> np.ndarray:
    """Logits [B, T, V] with rows grouped by member (member i owns rows [i*B/N, (i+1)*B/N)): each member's
    rows go through a copy of the HF model holding that member's dense weights W_i."""
    n, b = len(members), input_ids_BT.shape[0]
    if b % n:
        raise ValueError(f"{b} rows cannot be split over {n} members")
    per = b // n
    member_model = copy.deepcopy(hf_model)
    params = dict(member_model.named_parameters())
    out = []
    for i, deltas in enumerate(members):
        with torch.no_grad():
            for key, value in member_weights(hf_model, deltas).items():
                params[key].copy_(value.to(params[key].dtype))
        rows = slice(i * per, (i + 1) * per)
        out.append(reference_logits(member_model, input_ids_BT[rows], attention_mask_BT[rows]))
    return np.concatenate(out)


def es_gradient_from_members(hf_model: Any, members: list[dict[str, torch.Tensor]], shaped_N: torch.Tensor,
                             sigma: float) -> dict[str, torch.Tensor]:
    """g = 1/(N * sigma) * sum_i f_i * (W_i - W) per perturbed HF tensor (float64)."""
    n = len(members)
    base = {k: v.detach().double() for k, v in hf_model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    for f_i, deltas in zip(shaped_N.double().tolist(), members):
        for key, w_i in member_weights(hf_model, deltas).items():
            grads[key] = grads.get(key, torch.zeros_like(w_i)) + f_i * (w_i - base[key])
    return {key: g / (n * sigma) for key, g in grads.items()}


def es_sgd_step(hf_model: Any, grads: Mapping[str, torch.Tensor], learning_rate: float) -> None:
    """One `torch.optim.SGD` step on the ES direction: ES ascends the fitness, so the gradient is -g."""
    params = dict(hf_model.named_parameters())
    optimizer = torch.optim.SGD([params[k] for k in grads], lr=learning_rate)
    optimizer.zero_grad(set_to_none=True)
    for key, g in grads.items():
        params[key].grad = (-g).to(params[key].dtype)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
