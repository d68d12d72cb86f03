"""The rft bench suite runs (quick shapes) and reports a positive jax/hf datagen throughput ratio."""

from jaxcore.bench import BenchOptions
from jaxcore.bench.rft import run


def test_rft_bench_quick(tmp_path):
    result = run(BenchOptions(quick=True, workdir=str(tmp_path)))
    assert result["rft.jax_over_hf"] > 0
    assert result["rft.jax_over_hf"] == result["rft.jax_completions_per_s"] / result["rft.hf_completions_per_s"]
    assert result["rft.preset"] == "tiny" and result["rft.jax_tokens_per_s"] > 0 and result["rft.hf_tokens_per_s"] > 0
