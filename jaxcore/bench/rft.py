"""RFT datagen benchmark: rejection-sampling throughput with `--engine jax` vs `--engine hf`.

`run(options)` -> {"rft.jax_over_hf": jax completions/s / hf completions/s, ...}: the same model,
questions, K, batch sizes and max_new_tokens through `torchref.rft.datagen.generate_dataset`, both
engines in this run. Each engine does one untimed warm-up pass over the same batches (so JAX compile
time is excluded, and torch gets the same treatment), then the best of `repeats` timed passes.
Generated token counts are reported too: sampling stops at EOS, so the two may differ slightly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from jaxcore.bench import BenchOptions, device_info


def _checkpoint(options: BenchOptions, preset: str) -> Path:
    from jaxcore.hf.tiny import write_tiny_checkpoint

    path = Path(options.workdir) / f"rft-{options.family}-{preset}"
    if not (path / "config.json").is_file():
        write_tiny_checkpoint(path, options.family, preset=preset)
    return path


def _throughput(engine: Any, questions: list, config: Any, repeats: int) -> dict[str, float]:
    """Best completions/s (and its tokens/s) over `repeats` timed passes after one warm-up pass."""
    from torchref.rft.datagen import generate_dataset

    generate_dataset(engine, questions, config, progress=False)
    best: dict[str, float] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        _, stats = generate_dataset(engine, questions, config, progress=False)
        seconds = time.perf_counter() - start
        if not best or stats.completions / seconds > best["completions_per_s"]:
            best = {"completions_per_s": stats.completions / seconds, "tokens_per_s": stats.tokens / seconds,
                    "seconds": seconds}
    return best


def run(options: BenchOptions) -> dict[str, Any]:
    """`rft.jax_over_hf`: datagen completions/s of the jax engine over the hf engine, same run and shapes."""
    import torch

    from torchref.rft.data import make_split
    from torchref.rft.datagen import DatagenConfig
    from torchref.rft.engines import SamplingParams, load_engine

    torch.set_num_threads(os.cpu_count() or 1)
    preset = "tiny" if options.quick else options.preset
    n_questions, k, max_new_tokens = (4, 4, 16) if options.quick else (8, 4, 64)
    repeats = 1 if options.quick else 2
    path = _checkpoint(options, preset)
    questions = make_split("valid", n_questions, seed=0)
    config = DatagenConfig(oversample=k, batch_size=8, micro_batch_size=64, chunk_size=k, keep=1)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.7, seed=0)
    results = {name: _throughput(load_engine(name, path, params, dtype=options.dtype), questions, config, repeats)
               for name in ("hf", "jax")}
    hf, jx = results["hf"], results["jax"]
    return {"rft.jax_over_hf": jx["completions_per_s"] / hf["completions_per_s"],
            "rft.jax_completions_per_s": jx["completions_per_s"], "rft.hf_completions_per_s": hf["completions_per_s"],
            "rft.jax_tokens_per_s": jx["tokens_per_s"], "rft.hf_tokens_per_s": hf["tokens_per_s"],
            "rft.shape": f"{n_questions}q x K={k} x {max_new_tokens} new tokens", "rft.preset": preset,
            "rft.family": options.family, "rft.dtype": options.dtype, "rft.device": device_info()}
