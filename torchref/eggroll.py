"""The EGGROLL perturbed forward and update on the HF torch model, for parity with jaxcore.

Factors come from jaxcore as arrays (so this module needs no JAX random numbers): per jaxcore
parameter path, member i's `a_IR` and `b_OR` with sign and sigma/sqrt(r) folded into b
(`jaxcore.es.population.MemberNoise.of_member`). Member i's forward adds `(x @ a_i) @ b_i.T` to the
output of the HF module that owns the matrix (forward hooks on `nn.Linear` and GPT-2's `Conv1D`;
GPT-2's fused `c_attn` receives its q, k and v terms side by side).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from jaxcore.hf.mapping import tensor_maps
from jaxcore.model.config import ModelConfig


def _module_and_slot(cfg: ModelConfig) -> dict[str, tuple[str, int, str]]:
    """jaxcore matrix path -> (HF module name, position among fused outputs, HF weight name)."""
    out = {}
    for m in tensor_maps(cfg):
        if not m.hf_key.endswith(".weight"):
            continue
        for slot, path in enumerate(m.jax_paths):
            out[path] = (m.hf_key[: -len(".weight")], slot, m.hf_key)
    return out


def _as_tensor(x: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(x, np.float32))


@contextlib.contextmanager
def perturbed(hf_model: Any, cfg: ModelConfig, low_rank: dict[str, tuple[Any, Any]],
              dense: dict[str, Any] | None = None) -> Iterator[Any]:
    """Run `hf_model` as one member: low-rank terms via hooks, dense deltas added (and restored)."""
    modules = dict(hf_model.named_modules())
    slots = _module_and_slot(cfg)
    grouped: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for path, (a_IR, b_OR) in low_rank.items():
        if path.endswith("table"):
            raise NotImplementedError("torchref does not perturb embeddings")
        name, slot, _ = slots[path]
        grouped.setdefault(name, []).append((slot, _as_tensor(a_IR), _as_tensor(b_OR)))

    def hook(factors: list[tuple[int, torch.Tensor, torch.Tensor]]):
        factors = sorted(factors, key=lambda f: f[0])

        def add_low_rank(_module: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            x = inputs[0]
            return output + torch.cat([(x @ a) @ b.T for _, a, b in factors], dim=-1)

        return add_low_rank

    handles = [modules[name].register_forward_hook(hook(f)) for name, f in grouped.items()]
    saved = {}
    params = dict(hf_model.named_parameters())
    try:
        with torch.no_grad():
            for path, delta in (dense or {}).items():
                hf_key = _hf_vector_key(cfg, path)
                saved.setdefault(hf_key, params[hf_key].detach().clone())
                params[hf_key].add_(_vector_delta(cfg, path, delta, params[hf_key]))
        yield hf_model
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for hf_key, value in saved.items():
                params[hf_key].copy_(value)


def _hf_vector_key(cfg: ModelConfig, path: str) -> str:
    for m in tensor_maps(cfg):
        if path in m.jax_paths:
            return m.hf_key
    raise KeyError(path)


def _vector_delta(cfg: ModelConfig, path: str, delta: Any, target: torch.Tensor) -> torch.Tensor:
    """A jaxcore vector delta placed in the HF tensor (GPT-2's fused c_attn bias takes a slice)."""
    delta_t = _as_tensor(delta)
    for m in tensor_maps(cfg):
        if path in m.jax_paths and len(m.jax_paths) > 1:
            full = torch.zeros_like(target)
            width = target.shape[-1] // len(m.jax_paths)
            slot = m.jax_paths.index(path)
            full[..., slot * width:(slot + 1) * width] = delta_t
            return full
    return delta_t


def shape_fitness(fitness_N: torch.Tensor, mode: str = "zscore", group_size: int | None = None) -> torch.Tensor:
    """The same shaping as jaxcore.es.eggroll.shape_fitness (population variance, average ranks for ties)."""
    f = fitness_N.double()
    if mode == "zscore":
        return ((f - f.mean()) / torch.sqrt(f.var(unbiased=False) + 1e-5)).float()
    if mode == "group_zscore":
        grouped = f.reshape(-1, group_size)
        centred = (grouped - grouped.mean(1, keepdim=True)).reshape(-1)
        return (centred / torch.sqrt(f.var(unbiased=False) + 1e-5)).float()
    if mode == "centered_rank":
        below = (f[None, :] < f[:, None]).sum(1).double()
        equal = (f[None, :] == f[:, None]).sum(1).double()
        return ((below + (equal - 1) / 2) / max(len(f) - 1, 1) - 0.5).float()
    if mode == "none":
        return f.float()
    raise ValueError(f"unknown fitness shaping {mode!r}")


def es_gradient(pair_factors: dict[str, Any], shaped_N: torch.Tensor, rank: int,
                matrix_rows: dict[str, int]) -> dict[str, torch.Tensor]:
    """g per jaxcore path from unscaled pair noise (AB [P, I+O, r] or eps [P, ...]) and shaped fitness.

    g = (1/N) sum_i f_i sign_i A_i B_i^T / sqrt(r) for matrices; (1/N) sum_i f_i sign_i eps_i else (unit-variance
    noise, no sigma: an SGD learning rate is Qiu et al.'s alpha).
    """
    n = shaped_N.shape[0]
    diff_P = shaped_N[0::2] - shaped_N[1::2]
    grads = {}
    for path, raw in pair_factors.items():
        raw_t = _as_tensor(raw)
        if path in matrix_rows:
            rows = matrix_rows[path]
            a_PIR, b_POR = raw_t[:, :rows], raw_t[:, rows:]
            coeff = diff_P / (rank ** 0.5 * n)
            grads[path] = torch.einsum("p,pir,por->io", coeff, a_PIR, b_POR)
        else:
            grads[path] = torch.tensordot(diff_P / n, raw_t, dims=1)
    return grads


def apply_sgd(hf_model: Any, cfg: ModelConfig, grads: dict[str, torch.Tensor], learning_rate: float) -> None:
    """W <- W + lr * g in the HF layout (ES ascends the fitness; SGD on -g)."""
    params = dict(hf_model.named_parameters())
    with torch.no_grad():
        for m in tensor_maps(cfg):
            parts = [grads.get(p) for p in m.jax_paths]
            if all(g is None for g in parts):
                continue
            if any(g is None for g in parts):
                raise ValueError(f"{m.hf_key}: fused tensor with partially perturbed parts")
            if m.kind == "transpose":
                g_hf = parts[0].T
            elif m.kind == "split3":
                g_hf = torch.cat(parts, dim=-1)
            else:
                g_hf = parts[0]
            params[m.hf_key].add_(learning_rate * g_hf)
