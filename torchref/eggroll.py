"""EGGROLL fitness shaping in torch, for parity with `jaxcore.es.eggroll.shape_fitness`.

The perturbed forward and the ES update live in `torchref.es_reference`, which builds every member's
dense weights from jaxcore's raw draws and docs/design.md alone. (This module used to hold a hook-based
forward and a line-for-line mirror of jaxcore's update, fed with jaxcore's own scaled factors: a mistake
shared by both could not be seen, so they were removed.)
"""

from __future__ import annotations

import torch


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
