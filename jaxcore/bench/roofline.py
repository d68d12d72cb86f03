"""Roofline accounting: the bytes and FLOPs a step must move/do, and the device's measured peaks.

Counts come from an HF-style config dict (llama/qwen2/qwen3: `hidden_size`, `num_hidden_layers`, ...;
gpt2: `n_embd`, `n_layer`, ...) or a loaded jaxcore model. Conventions (also in docs/benchmarks.md):

- weights are read once per forward step in the compute dtype; the input embedding (and GPT-2's
  learned position table) is a gather of one row per token, the LM head (tied or not) a V x D matmul;
- the LM head runs only where logits are used: every position in a training step, the last position
  only in a prefill (`jaxcore.inference.generate` passes `last_only=True`), one position per decode step;
- a decode step at cache length L reads the K and V caches up to L and writes one position;
- FLOPs are 2 per multiply-add; attention counts QK^T and PV over the useful (causal) positions;
- EGGROLL stores one rank-r factor pair (in + out) x r per noised matrix per antithetic pair, i.e.
  population / 2 sets, read every forward step, and adds 2 r (in + out) FLOPs per token;
- a run of several phases (a prefill, then decode steps) is bounded by the sum over phases of each
  phase's own limit, `max(bytes / bandwidth, flops / peak_flops)`: the compute-bound prefill and the
  memory-bound decode steps cannot overlap, so max(total bytes / bw, total flops / peak) would
  understate it; `fraction_of_limit = limit_time / measured`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

Work = dict[str, int]                                   # {"bytes": ..., "flops": ...}
Phases = list[tuple[str, Work]]                         # [(phase name, work), ...] in execution order


@dataclasses.dataclass(frozen=True)
class Shape:
    """The dimensions the accounting needs."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie: bool
    qkv_bias: bool = False
    gated: bool = True              # SwiGLU (gate, up, down); False: GPT-2's up, gelu, down
    out_bias: bool = False          # bias on the attention output projection
    mlp_bias: bool = False          # biases on the MLP projections
    layer_norm: bool = False        # LayerNorm (scale + bias) rather than RMSNorm (scale)
    qk_norm: bool = False           # Qwen3, Gemma 3: RMSNorm scales on q and k heads
    sandwich_norms: bool = False    # Gemma 3: norms after attention and after the MLP too (4 a layer)
    positions: int = 0              # rows of a learned position table (GPT-2); 0 with RoPE

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> Shape:
        if cfg.get("model_type") == "gpt2":
            hidden, heads = cfg["n_embd"], cfg["n_head"]
            return cls(hidden=hidden, layers=cfg["n_layer"], heads=heads, kv_heads=heads,
                       head_dim=hidden // heads, intermediate=cfg.get("n_inner") or 4 * hidden,
                       vocab=cfg["vocab_size"], tie=bool(cfg.get("tie_word_embeddings", True)), qkv_bias=True,
                       gated=False, out_bias=True, mlp_bias=True, layer_norm=True, positions=cfg["n_positions"])
        if cfg.get("model_type") == "gemma3":           # the multimodal config: its text tower
            cfg = cfg["text_config"]
        heads = cfg["num_attention_heads"]
        family = cfg.get("model_type")
        gemma = family == "gemma3_text"
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   tie=bool(cfg.get("tie_word_embeddings", gemma)),
                   qkv_bias=attention_bias or family == "qwen2",
                   out_bias=attention_bias and family != "qwen2",
                   mlp_bias=bool(cfg.get("mlp_bias", False)) and family == "llama",
                   qk_norm=family == "qwen3" or gemma, sandwich_norms=gemma)

    def layer_matrices(self) -> list[tuple[int, int]]:
        """(in, out) of each matmul weight of one decoder layer: q, k, v, o, [gate,] up, down."""
        d, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        mlp = [(d, i), (d, i), (i, d)] if self.gated else [(d, i), (i, d)]
        return [(d, q), (d, kv), (d, kv), (q, d), *mlp]

    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    def matmul_params(self) -> int:
        """Parameters used as matmul weights per token (all layers + LM head)."""
        per_layer = sum(a * b for a, b in self.layer_matrices())
        return self.layers * per_layer + self.lm_head_params()

    def vector_params(self) -> int:
        """Norm scales (and LayerNorm biases), linear biases, q/k norm scales (read every step too)."""
        d, hd = self.hidden, self.head_dim
        norm = 2 * d if self.layer_norm else d
        per_layer = (4 if self.sandwich_norms else 2) * norm
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * hd
        if self.out_bias:
            per_layer += d
        if self.mlp_bias:
            per_layer += (2 if self.gated else 1) * self.intermediate + d
        if self.qk_norm:
            per_layer += 2 * hd
        return self.layers * per_layer + norm

    def gathered_rows(self) -> int:
        """Table rows gathered per token: the token embedding, plus a learned position (GPT-2)."""
        return 2 if self.positions else 1

    def total_params(self) -> int:
        embed = 0 if self.tie else self.vocab * self.hidden
        return self.matmul_params() + self.vector_params() + embed + self.positions * self.hidden


def kv_bytes(shape: Shape, batch: int, length: int, itemsize: int) -> int:
    """Bytes of the K and V caches for `batch` rows up to `length` positions."""
    return 2 * shape.layers * batch * length * shape.kv_heads * shape.head_dim * itemsize


def attention_flops(shape: Shape, batch: int, queries: int, keys_before: int) -> int:
    """QK^T and PV FLOPs for `queries` new causal positions after `keys_before` cached ones."""
    # query j (0-based) sees keys_before + j + 1 keys
    seen = queries * keys_before + queries * (queries + 1) // 2
    return 2 * 2 * shape.layers * batch * shape.heads * shape.head_dim * seen


def factor_sets(population: int) -> int:
    """Factor sets EGGROLL stores for a population: one per antithetic pair (members 2k and 2k + 1)."""
    return -(-population // 2)


def factor_bytes(targets: Sequence[tuple[int, int]], population: int, rank: int, itemsize: int) -> int:
    """EGGROLL factors for matrices of (in, out): r * (in + out) values per antithetic pair each."""
    return sum(factor_sets(population) * rank * (a + b) for a, b in targets) * itemsize


def factor_flops(targets: Sequence[tuple[int, int]], tokens: int, rank: int) -> int:
    """Extra FLOPs of the rank-r term (x A) B^T for `tokens` token rows."""
    return sum(2 * tokens * rank * (a + b) for a, b in targets)


def weight_bytes(shape: Shape, tokens: int, itemsize: int) -> int:
    """One forward step's weight reads: every matmul and vector parameter once, plus the gathered rows."""
    return ((shape.matmul_params() + shape.vector_params()) * itemsize
            + tokens * shape.gathered_rows() * shape.hidden * itemsize)


def decode_step(shape: Shape, batch: int, length: int, itemsize: int, *,
                factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> Work:
    """One decode step for `batch` rows with `length` positions already cached."""
    cache = kv_bytes(shape, batch, length, itemsize) + kv_bytes(shape, batch, 1, itemsize)
    factors = factor_bytes(factor_targets, batch, rank, itemsize)
    flops = (2 * batch * shape.matmul_params() + attention_flops(shape, batch, 1, length)
             + factor_flops(factor_targets, batch, rank))
    return {"bytes": weight_bytes(shape, batch, itemsize) + cache + factors, "flops": flops}


def prefill(shape: Shape, batch: int, prompt_len: int, itemsize: int, *,
            factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> Work:
    """The prompt forward: weights once, the prompt's KV written, every prompt token through every layer
    matmul, and the LM head at the last position only (`last_only=True`)."""
    tokens = batch * prompt_len
    nbytes = (weight_bytes(shape, tokens, itemsize) + kv_bytes(shape, batch, prompt_len, itemsize)
              + factor_bytes(factor_targets, batch, rank, itemsize))
    layer_params = shape.matmul_params() - shape.lm_head_params()
    flops = (2 * tokens * layer_params + 2 * batch * shape.lm_head_params()
             + attention_flops(shape, batch, prompt_len, 0) + factor_flops(factor_targets, tokens, rank))
    return {"bytes": nbytes, "flops": flops}


def decode_phases(shape: Shape, batch: int, prompt_len: int, new_tokens: int, itemsize: int, *,
                  factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> Phases:
    """The `new_tokens - 1` decode steps after a prompt (the first new token comes from the prefill)."""
    return [("decode", decode_step(shape, batch, prompt_len + step, itemsize, factor_targets=factor_targets,
                                   rank=rank)) for step in range(new_tokens - 1)]


def generation(shape: Shape, batch: int, prompt_len: int, new_tokens: int, itemsize: int, *,
               factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> Phases:
    """A whole generate() call: the prefill, then the decode steps, each its own phase."""
    kw = dict(factor_targets=factor_targets, rank=rank)
    return [("prefill", prefill(shape, batch, prompt_len, itemsize, **kw)),
            *decode_phases(shape, batch, prompt_len, new_tokens, itemsize, **kw)]


def totals(phases: Phases | Work) -> Work:
    """Summed bytes and FLOPs of a list of phases (or one work dict)."""
    if isinstance(phases, dict):
        return {"bytes": int(phases["bytes"]), "flops": int(phases["flops"])}
    return {k: int(sum(work[k] for _, work in phases)) for k in ("bytes", "flops")}


def adam_step(params: int) -> Work:
    """One Adam(W) step on fp32 masters: per parameter it reads weight, grad, m, v and writes weight, m, v
    (7 x 4 bytes); ~20 FLOPs per entry, which no CPU or GPU is bound by."""
    return {"bytes": 7 * 4 * params, "flops": 20 * params}


def train_step(shape: Shape, batch: int, seq_len: int, compute_itemsize: int,
               head_positions: int | None = None) -> Work:
    """Forward + backward (3x forward FLOPs) and AdamW on fp32 masters. With `head_positions` (GRPO: only the
    positions that score a completion token), the LM head runs there only, and so do the last layer's queries,
    output projection and MLP (nothing reads them elsewhere); its keys and values cover every position.

    Bytes: the compute-dtype weights read 3x (forward, two backward matmuls), and per fp32 parameter
    the optimizer reads weight, grad, m, v and writes weight, m, v (7 x 4 bytes)."""
    tokens = batch * seq_len
    params = shape.total_params()
    scored = seq_len if head_positions is None else head_positions
    head = batch * scored
    trunk = shape.matmul_params() - shape.lm_head_params()
    q, _k, _v, *query_side = shape.layer_matrices()
    last_queries = sum(a * b for a, b in [q, *query_side])           # q, o and the MLP of the last layer
    skipped = 2 * batch * (seq_len - scored) * last_queries
    skipped_attention = attention_flops(shape, batch, seq_len - scored, 0) // shape.layers     # its first queries
    flops = 3 * (2 * tokens * trunk + 2 * head * shape.lm_head_params() + attention_flops(shape, batch, seq_len, 0)
                 - skipped - skipped_attention)
    nbytes = 3 * params * compute_itemsize + adam_step(params)["bytes"]
    return {"bytes": nbytes, "flops": flops}


def _sig(x: float, digits: int = 4) -> float:
    """Round to `digits` significant digits (a tiny fraction stays positive, unlike round(x, 4))."""
    return float(f"{x:.{digits}g}")


_ENTRIES: list[tuple[dict[str, Any], Any]] = []          # every entry limit() made, with its work


def limit(work: Phases | Work, peaks: dict[str, float], measured_s: float) -> dict[str, Any]:
    """Roofline entry: the time the hardware needs at best, what bounds it, and the measured fraction of it.

    `work` is one phase ({"bytes", "flops"}) or a list of (name, work) phases; the limit is the sum over
    phases of max(bytes / bandwidth, flops / peak), reported per phase name under `phases`. The entry is
    remembered so that `reprice` can recompute it with a run's final peaks."""
    entry = _price(work, peaks, measured_s)
    _ENTRIES.append((entry, work))
    return entry


def reprice(peaks: dict[str, float]) -> int:
    """Recompute, in place, every entry made by `limit` since `forget_entries` with these peaks (a run's
    best measurement, so that all its fractions use the same peaks). Returns how many."""
    for entry, work in _ENTRIES:
        entry.update(_price(work, peaks, entry["measured_s"]))
    return len(_ENTRIES)


def forget_entries() -> None:
    _ENTRIES.clear()


def _price(work: Phases | Work, peaks: dict[str, float], measured_s: float) -> dict[str, Any]:
    bw, peak = peaks["bandwidth_bytes_per_s"], peaks["matmul_flops_per_s"]
    phases: Phases = [("step", work)] if isinstance(work, dict) else list(work)
    groups: dict[str, dict[str, Any]] = {}
    memory_limited_s = 0.0
    for name, w in phases:
        memory_s, compute_s = w["bytes"] / bw, w["flops"] / peak
        g = groups.setdefault(name, {"count": 0, "bytes": 0, "flops": 0, "limit_s": 0.0, "memory_bound": 0})
        g["count"] += 1
        g["bytes"] += int(w["bytes"])
        g["flops"] += int(w["flops"])
        g["limit_s"] += max(memory_s, compute_s)
        g["memory_bound"] += memory_s >= compute_s
        memory_limited_s += memory_s if memory_s >= compute_s else 0.0
    limit_s = sum(g["limit_s"] for g in groups.values())
    for g in groups.values():
        m = g.pop("memory_bound")
        g["bound"] = "memory" if m == g["count"] else "compute" if m == 0 else f"mixed ({m}/{g['count']} memory)"
    total = totals(phases)
    entry: dict[str, Any] = {
        **total, "limit_s": limit_s, "memory_s": total["bytes"] / bw, "compute_s": total["flops"] / peak,
        "bound": "memory" if memory_limited_s >= limit_s / 2 else "compute", "measured_s": measured_s,
        "fraction_of_limit": _sig(limit_s / measured_s) if measured_s > 0 else None,
        "mfu": _sig(total["flops"] / measured_s / peak) if measured_s > 0 else None,
        "peaks": {"bandwidth_bytes_per_s": bw, "matmul_flops_per_s": peak}}
    if len(phases) > 1:
        entry["phases"] = groups
    return entry


def measure_peaks(dtype: str = "float32", *, copy_bytes: int | None = None, gemm_n: int | None = None,
                  repeats: int = 3) -> dict[str, Any]:
    """Measured peak bandwidth (a large elementwise copy: read + write) and matmul throughput (an n^3
    GEMM), both in the compute dtype on the default device."""
    import jax
    import jax.numpy as jnp

    on_cpu = jax.devices()[0].platform == "cpu"
    copy_bytes = copy_bytes or (256 << 20 if on_cpu else 4 << 30)
    gemm_n = gemm_n or (1536 if on_cpu else 8192)
    dt = jnp.dtype(dtype)

    def best(fn: Any, *args: Any) -> float:
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        return min(times)

    # the input is donated so the output reuses its buffer (no fresh pages to fault in per call)
    scale = jax.jit(lambda v: -v, donate_argnums=0)
    x = scale(jnp.ones((copy_bytes // dt.itemsize,), dt))
    copy_times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        x = jax.block_until_ready(scale(x))
        copy_times.append(time.perf_counter() - start)
    copy_s = min(copy_times[1:])
    del x
    a = jnp.asarray(np.random.default_rng(0).standard_normal((gemm_n, gemm_n)), dt)
    gemm_s = best(jax.jit(lambda p, q: p @ q), a, a)
    copy_bytes = copy_bytes // dt.itemsize * dt.itemsize
    return {"bandwidth_bytes_per_s": 2 * copy_bytes / copy_s, "matmul_flops_per_s": 2 * gemm_n ** 3 / gemm_s,
            "copy_bytes": copy_bytes, "gemm_n": gemm_n, "dtype": dtype}


# Smaller peak measurements for --quick runs (tests): still well past the CPU's caches.
QUICK_PEAK_SIZES = {"copy_bytes": 64 << 20, "gemm_n": 768}
_PEAKS: dict[tuple[str, bool], dict[str, Any]] = {}
_MEASUREMENTS: dict[tuple[str, bool], list[dict[str, Any]]] = {}


def peaks_for(dtype: str, quick: bool = False, *, refresh: bool = False) -> dict[str, Any]:
    """The best peaks measured so far in this process for `dtype` (every suite of one run shares them).

    The first call measures; `refresh=True` measures again (each suite does so right after its timings)
    and keeps the larger of each peak: on a shared machine a measurement taken under load understates
    what the hardware can do, which would overstate fraction_of_limit."""
    import jax

    key = (dtype, quick)
    if key not in _PEAKS or refresh:
        on_cpu = jax.devices()[0].platform == "cpu"
        new = measure_peaks(dtype, **(QUICK_PEAK_SIZES if quick and on_cpu else {}))
        _MEASUREMENTS.setdefault(key, []).append(new)
        old = _PEAKS.get(key, new)
        _PEAKS[key] = {**new, **{k: max(old[k], new[k]) for k in ("bandwidth_bytes_per_s", "matmul_flops_per_s")},
                       "measurements": len(_MEASUREMENTS[key])}
    return _PEAKS[key]


def peak_measurements(dtype: str, quick: bool = False) -> list[dict[str, Any]]:
    """Every peak measurement taken in this process for `dtype` (in order), for the report."""
    return list(_MEASUREMENTS.get((dtype, quick), []))


def model_shape(model: Any) -> Shape:
    """Shape of a loaded jaxcore model (any supported family)."""
    cfg = model.config
    return Shape(hidden=cfg.hidden_size, layers=cfg.num_layers, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                 head_dim=cfg.head_dim, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                 tie=cfg.tie_word_embeddings, qkv_bias=cfg.qkv_bias, gated=cfg.gated_mlp, out_bias=cfg.out_bias,
                 mlp_bias=cfg.mlp_bias, layer_norm=cfg.norm_type == "layer", qk_norm=cfg.qk_norm,
                 sandwich_norms=cfg.sandwich_norms,
                 positions=cfg.max_position_embeddings if cfg.learned_positions else 0)
