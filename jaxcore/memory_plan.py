"""Per-device memory of an ES run on a (pop, model) mesh, from config.json alone (no weights).

Terms (bytes per device, D devices, M = mesh.model, pop = D / M):
compute weights (compute dtype, q/k/v/gate/up/o/down/embedding/lm_head split over M), master
weights (master dtype, FSDP over all D), optimizer state (0, 1 or 2 master-sized copies), factors
(N/2 pairs of (I+O) x r per perturbed matrix, pairs over pop, each factor over M with its weight),
update factors (their fp32 regeneration in the update, whose output is each device's slice of g),
KV cache (rows N*P*G/pop, kv heads over M) and activations
(one prefill layer's working set and the fp32 logits of the rows).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxcore.errors import UserError
from jaxcore.generate import bucket_length
from jaxcore.model_config import ModelConfig

GB = 1e9
_OPT_COPIES = {"sgd": 0, "adam": 2, "adamw": 2}


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device for each term, and what fits."""

    terms: dict[str, float]
    devices: int
    model_axis: int
    device_memory: float | None
    population: int

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.device_memory is None or self.total <= self.device_memory

    def biggest(self) -> str:
        return max(self.terms, key=self.terms.get)  # type: ignore[arg-type]

    def table(self) -> str:
        lines = [f"{name:<16}{value / GB:10.2f} GB" for name, value in self.terms.items()]
        lines.append(f"{'total':<16}{self.total / GB:10.2f} GB per device ({self.devices} devices, "
                     f"mesh pop="
                     f"{self.devices // self.model_axis} model={self.model_axis}, population {self.population})")
        if self.device_memory is not None:
            lines.append(f"{'device memory':<16}{self.device_memory / GB:10.2f} GB: "
                         + ("fits" if self.fits else "does NOT fit"))
        return "\n".join(lines)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape (abstract model: no arrays are allocated)."""
    from jaxcore.convert import flat_state
    from jaxcore.model import abstract_model

    return {k: tuple(v.shape) for k, v in flat_state(abstract_model(cfg)).items()}


def _split(path: str, shape: tuple[int, ...], m: int) -> tuple[int, int]:
    """(input, output) divisors of a weight over the model axis (its tensor-parallel spec)."""
    from jaxcore.sharding import tensor_parallel_spec

    spec = tuple(tensor_parallel_spec(path, shape, "model", m)) + (None, None)
    return (m if spec[0] else 1), (m if spec[1] else 1)


def plan_es(cfg: ModelConfig, *, population: int, rank: int, prompts: int, generations: int, prompt_tokens: int,
            max_new_tokens: int, devices: int, model_axis: int = 1, compute_dtype: str = "float32",
            master_dtype: str = "float32", optimizer: str = "sgd", momentum: bool = False,
            targets: tuple[str, ...] | None = None, device_memory: float | None = None) -> MemoryPlan:
    """The per-device memory of one ES epoch; `targets` are the perturbed paths (default: every matrix
    but the embedding and the LM head, as EGGROLL's defaults)."""
    shapes = param_shapes(cfg)
    c, mb = np.dtype(compute_dtype).itemsize, np.dtype(master_dtype).itemsize
    m, pop = model_axis, devices // model_axis
    if targets is None:
        targets = tuple(p for p, s in shapes.items() if len(s) == 2 and p not in ("embed.table", "lm_head.kernel",
                                                                                    "pos_embed.table"))
    compute = 0.0
    for path, shape in shapes.items():
        d_in, d_out = _split(path, shape, m) if len(shape) == 2 else (1, 1)
        compute += math.prod(shape) * c / (d_in * d_out)
    count = sum(math.prod(s) for s in shapes.values())
    target_count = sum(math.prod(shapes[p]) for p in targets)
    copies = _OPT_COPIES.get(optimizer, 2) + (1 if optimizer == "sgd" and momentum else 0)
    pairs_per_device = max(population // 2 // pop, 1)
    factors = 0.0
    regenerate = 0.0
    for path in targets:
        i, o = shapes[path]
        d_in, d_out = _split(path, shapes[path], m)
        factors += pairs_per_device * rank * (i / d_in + o / d_out) * c
        regenerate += population // 2 * rank * (i + o) * 4
    rows = population * prompts * generations // pop
    length = bucket_length(prompt_tokens) + max_new_tokens
    kv_heads = cfg.num_kv_heads / m if cfg.num_kv_heads % m == 0 else cfg.num_kv_heads
    heads = cfg.num_heads / m if cfg.num_heads % m == 0 else cfg.num_heads
    kv_cache = 2 * cfg.num_layers * rows * kv_heads * length * cfg.head_dim * c
    t = bucket_length(prompt_tokens)
    layer = rows * t * (4 * cfg.hidden_size + 3 * cfg.intermediate_size / m) * c + rows * heads * t * t * 4
    logits = 2 * rows * cfg.vocab_size * 4
    terms = {"compute weights": compute, "master weights": count * mb / devices,
             "optimizer state": copies * target_count * mb / devices, "factors": factors,
             "update factors": regenerate / devices,
             "kv cache": kv_cache, "activations": layer + logits}
    return MemoryPlan(terms, devices, m, device_memory, population)


def largest_population(fits: Any, start: int, devices: int) -> int:
    """The largest population (a multiple of 2 * pop devices) for which `fits(population)` holds; 0 if none."""
    step = 2 * devices
    best, n = 0, step
    while n <= max(start, step) * 64 and fits(n):
        best, n = n, n * 2
    lo, hi = best, n          # refine between the last fitting power of two and the first failing one
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def parse_bytes(text: str) -> float:
    """'40GB', '40GiB', '4e10' -> bytes."""
    units = {"gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6, "kib": 2**10, "kb": 1e3, "b": 1}
    lowered = text.strip().lower()
    number, scale = lowered, 1.0
    for unit, unit_scale in units.items():
        if lowered.endswith(unit):
            number, scale = lowered[: -len(unit)], unit_scale
            break
    try:
        return float(number) * scale
    except ValueError:
        raise UserError(f"device memory {text!r}: expected a size such as 40GB, 80GiB or 4e10") from None


def plan_es_config(es_cfg: Any, model_cfg: ModelConfig, *, devices: int, device_memory: float | None = None,
                   prompt_tokens: int = 128, population: int | None = None) -> MemoryPlan:
    """`plan_es` for a `jaxcore es` config (ESConfig)."""
    es, r, opt = es_cfg.es, es_cfg.rollout, es_cfg.optimizer
    return plan_es(model_cfg, population=population or es.population, rank=es.rank, prompts=r.prompts_per_epoch,
                   generations=r.generations_per_prompt, prompt_tokens=prompt_tokens, max_new_tokens=r.max_new_tokens,
                   devices=devices, model_axis=es_cfg.mesh.model, compute_dtype=es_cfg.model.dtype,
                   master_dtype=es.master_dtype, optimizer=opt.name, momentum=bool(opt.momentum),
                   device_memory=device_memory)


_ADVICE = {"compute weights": "raise mesh.model", "master weights": "use more devices or es.master_dtype=bfloat16",
           "optimizer state": "use optimizer.name=sgd or es.master_dtype=bfloat16",
           "factors": "lower es.population or es.rank", "update factors": "lower es.population or es.rank",
           "kv cache": "lower es.population, rollout.prompts_per_epoch "
           "or rollout.max_new_tokens, or raise mesh.model", "activations": "lower rollout.prompts_per_epoch or "
           "es.population"}


def refusal(plan: MemoryPlan) -> str | None:
    """One line saying why a plan does not fit and what to change; None when it fits."""
    if plan.fits:
        return None
    name = plan.biggest()
    return (f"this run needs {plan.total / GB:.1f} GB per device but a device has {plan.device_memory / GB:.1f} GB; "
            f"the biggest term is {name} ({plan.terms[name] / GB:.1f} GB): {_ADVICE[name]} "
            f"(see `jaxcore plan`)")


def check_es_fits(es_cfg: Any, prompt_tokens: int = 128) -> str | None:
    """The refusal line when the configured ES run cannot fit its devices, else None. Device memory:
    `mesh.device_memory`, else the accelerator's own limit; CPU backends are not checked otherwise."""
    import json
    from pathlib import Path

    import jax

    from jaxcore.model_config import config_from_hf

    memory = parse_bytes(es_cfg.mesh.device_memory) if es_cfg.mesh.device_memory else None
    if memory is None and jax.default_backend() != "cpu":
        memory = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    source = Path(es_cfg.model.path) / "config.json"
    if memory is None or not source.is_file() or jax.device_count() % es_cfg.mesh.model:
        return None
    model_cfg = config_from_hf(json.loads(source.read_text()))
    return refusal(plan_es_config(es_cfg, model_cfg, devices=jax.device_count(), device_memory=memory,
                                  prompt_tokens=prompt_tokens))
