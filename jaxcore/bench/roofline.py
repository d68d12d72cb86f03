"""Roofline accounting: the bytes and FLOPs a step must move/do, and the device's measured peaks.

Counts come from an HF-style config dict (`hidden_size`, `num_hidden_layers`, `num_attention_heads`,
`num_key_value_heads`, `intermediate_size`, `vocab_size`, optional `head_dim`, `tie_word_embeddings`,
`attention_bias`). Conventions (also in docs/benchmarks.md):

- weights are read once per forward step in the compute dtype; the input embedding is a gather (B rows),
  the LM head (tied or not) is a full V x D matmul;
- a decode step at cache length L reads the K and V caches up to L and writes one position;
- FLOPs are 2 per multiply-add; attention counts QK^T and PV over the useful (causal) positions;
- EGGROLL adds per member a rank-r factor pair (in + out) x r per noised matrix: read, and 2 r (in + out)
  FLOPs per token;
- `limit_time = max(bytes / bandwidth, flops / peak_flops)`; `fraction_of_limit = limit_time / measured`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


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

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> Shape:
        heads = cfg["num_attention_heads"]
        qkv_bias = bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2"))
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   tie=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=qkv_bias)

    def layer_matrices(self) -> list[tuple[int, int]]:
        """(in, out) of each matmul weight of one decoder layer: q, k, v, o, gate, up, down."""
        d, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(d, q), (d, kv), (d, kv), (q, d), (d, i), (d, i), (i, d)]

    def matmul_params(self) -> int:
        """Parameters used as matmul weights per token (all layers + LM head)."""
        per_layer = sum(a * b for a, b in self.layer_matrices())
        return self.layers * per_layer + self.vocab * self.hidden

    def vector_params(self) -> int:
        """Norm scales and biases (read every step too)."""
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return self.layers * (2 * self.hidden + bias) + self.hidden

    def total_params(self) -> int:
        embed = 0 if self.tie else self.vocab * self.hidden
        return self.matmul_params() + self.vector_params() + embed


def kv_bytes(shape: Shape, batch: int, length: int, itemsize: int) -> int:
    """Bytes of the K and V caches for `batch` rows up to `length` positions."""
    return 2 * shape.layers * batch * length * shape.kv_heads * shape.head_dim * itemsize


def attention_flops(shape: Shape, batch: int, queries: int, keys_before: int) -> int:
    """QK^T and PV FLOPs for `queries` new causal positions after `keys_before` cached ones."""
    # query j (0-based) sees keys_before + j + 1 keys
    seen = queries * keys_before + queries * (queries + 1) // 2
    return 2 * 2 * shape.layers * batch * shape.heads * shape.head_dim * seen


def factor_bytes(targets: Sequence[tuple[int, int]], population: int, rank: int, itemsize: int) -> int:
    """EGGROLL factors of every member for matrices of (in, out): population * r * (in + out) each."""
    return sum(population * rank * (a + b) for a, b in targets) * itemsize


def factor_flops(targets: Sequence[tuple[int, int]], tokens: int, rank: int) -> int:
    """Extra FLOPs of the rank-r term x B (A^T) for `tokens` token rows."""
    return sum(2 * tokens * rank * (a + b) for a, b in targets)


def decode_step(shape: Shape, batch: int, length: int, itemsize: int, *,
                factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> dict[str, int]:
    """One decode step for `batch` rows with `length` positions already cached."""
    weights = (shape.matmul_params() + shape.vector_params()) * itemsize + batch * shape.hidden * itemsize
    cache = kv_bytes(shape, batch, length, itemsize) + kv_bytes(shape, batch, 1, itemsize)
    factors = factor_bytes(factor_targets, batch, rank, itemsize)
    flops = (2 * batch * shape.matmul_params() + attention_flops(shape, batch, 1, length)
             + factor_flops(factor_targets, batch, rank))
    return {"bytes": weights + cache + factors, "flops": flops}


def prefill(shape: Shape, batch: int, prompt_len: int, itemsize: int, *,
            factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> dict[str, int]:
    """The prompt forward: weights once, the prompt's KV written, every prompt token through every matmul."""
    tokens = batch * prompt_len
    weights = (shape.matmul_params() + shape.vector_params()) * itemsize + tokens * shape.hidden * itemsize
    nbytes = weights + kv_bytes(shape, batch, prompt_len, itemsize) + factor_bytes(factor_targets, batch, rank,
                                                                                   itemsize)
    flops = (2 * tokens * shape.matmul_params() + attention_flops(shape, batch, prompt_len, 0)
             + factor_flops(factor_targets, tokens, rank))
    return {"bytes": nbytes, "flops": flops}


def generation(shape: Shape, batch: int, prompt_len: int, new_tokens: int, itemsize: int, *,
               factor_targets: Sequence[tuple[int, int]] = (), rank: int = 1) -> dict[str, int]:
    """Prefill plus `new_tokens - 1` decode steps (the first new token comes from the prefill's logits)."""
    total = prefill(shape, batch, prompt_len, itemsize, factor_targets=factor_targets, rank=rank)
    for step in range(new_tokens - 1):
        one = decode_step(shape, batch, prompt_len + step, itemsize, factor_targets=factor_targets, rank=rank)
        total = {k: total[k] + one[k] for k in total}
    return total


def train_step(shape: Shape, batch: int, seq_len: int, compute_itemsize: int) -> dict[str, int]:
    """Forward + backward (3x forward FLOPs) and AdamW on fp32 master weights.

    Bytes: the compute-dtype weights read 3x (forward, two backward matmuls), and per fp32 parameter
    the optimizer reads weight, grad, m, v and writes weight, m, v (7 x 4 bytes)."""
    tokens = batch * seq_len
    params = shape.total_params()
    flops = 3 * (2 * tokens * shape.matmul_params() + attention_flops(shape, batch, seq_len, 0))
    nbytes = 3 * params * compute_itemsize + 7 * 4 * params
    return {"bytes": nbytes, "flops": flops}


def limit(work: dict[str, int], peaks: dict[str, float], measured_s: float) -> dict[str, Any]:
    """Roofline entry: the time the hardware needs at best, what bounds it, and measured fraction of it."""
    memory_s = work["bytes"] / peaks["bandwidth_bytes_per_s"]
    compute_s = work["flops"] / peaks["matmul_flops_per_s"]
    limit_s = max(memory_s, compute_s)
    return {"bytes": int(work["bytes"]), "flops": int(work["flops"]), "limit_s": limit_s,
            "bound": "memory" if memory_s >= compute_s else "compute", "measured_s": measured_s,
            "fraction_of_limit": round(limit_s / measured_s, 4)}


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
    return {"bandwidth_bytes_per_s": 2 * copy_bytes / copy_s, "matmul_flops_per_s": 2 * gemm_n ** 3 / gemm_s,
            "copy_bytes": copy_bytes, "gemm_n": gemm_n, "dtype": dtype}


_PEAKS: dict[str, dict[str, Any]] = {}


def peaks_for(dtype: str) -> dict[str, Any]:
    """measure_peaks, once per process and dtype (every suite of one run shares the same measurement)."""
    if dtype not in _PEAKS:
        _PEAKS[dtype] = measure_peaks(dtype)
    return _PEAKS[dtype]


def model_shape(model: Any) -> Shape:
    """Shape of a loaded jaxcore model (llama/qwen layout)."""
    cfg = model.config
    return Shape(hidden=cfg.hidden_size, layers=cfg.num_layers, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                 head_dim=cfg.head_dim, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                 tie=cfg.tie_word_embeddings, qkv_bias=cfg.qkv_bias)
