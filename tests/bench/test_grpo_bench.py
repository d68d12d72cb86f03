"""The GRPO benchmark runs (quick shapes) and the bf16-vs-fp32 check stays within its tolerance."""

import numpy as np
import pytest

from jaxcore.bench import BenchOptions
from jaxcore.bench.grpo import bf16_vs_fp32, run, shapes, synthetic_batch


def test_synthetic_batch_shapes_and_truncation():
    batch = synthetic_batch(50, 8, 6, 10, group_size=4, seed=0)
    assert batch.input_ids_BT.shape == (8, 16) and batch.completion_mask_BL.shape == (8, 15)
    assert batch.truncated_B.tolist() == [True, False] * 4            # even rows run to the length limit
    lengths = batch.attention_mask_BT.sum(1)
    assert len(set(lengths.tolist())) > 1                              # unequal lengths
    np.testing.assert_allclose(batch.advantages_B.reshape(2, 4).sum(1), 0, atol=1e-5)


def test_quick_bench_reports_the_ratio(tmp_path):
    out = run(BenchOptions(quick=True, workdir=str(tmp_path)))
    assert out["grpo.jax_over_torch"] > 0
    assert out["grpo.jax_step_s"] > 0 and out["grpo.torch_step_s"] > 0
    assert out["grpo.model"]["layers"] == 2 and out["grpo.batch"] == "4x32"
    for side in ("jax", "torch"):
        entry = out[f"grpo.{side}_roofline"]
        assert entry["bytes"] > 0 and entry["flops"] > 0 and entry["bound"] in ("memory", "compute")
        assert entry["measured_s"] == out[f"grpo.{side}_step_s"]
        assert 0 < entry["fraction_of_limit"] <= 1.5
    # MFU: the step's FLOPs per second over the measured peak matmul throughput (a share of it, not > 1.5)
    entry = out["grpo.jax_roofline"]
    assert out["grpo.jax_mfu"] == pytest.approx(
        entry["flops"] / entry["measured_s"] / entry["peaks"]["matmul_flops_per_s"], rel=1e-3)
    assert 0 < out["grpo.jax_mfu"] <= 1.5 and 0 < out["grpo.torch_mfu"] <= 1.5
    assert out["grpo.jax_mfu"] / out["grpo.torch_mfu"] == pytest.approx(out["grpo.jax_over_torch"], rel=1e-3)
    assert out["grpo.device"]["device"].startswith("cpu")


@pytest.mark.parametrize("preset, params, expected", [
    ("smollm2-135m", 134_515_008, (32, 64, 256)), ("qwen2.5-0.5b", 494_032_768, (16, 64, 256)),
    ("qwen2.5-1.5b", 1_543_714_304, (8, 64, 256)), ("llama3-8b", 8_030_261_248, (2, 64, 256)),
    ("bench", 33_600_000, (8, 32, 96))])
def test_grpo_shape_scales_with_the_preset(preset, params, expected):
    assert shapes(BenchOptions(preset=preset), params) == expected
    assert shapes(BenchOptions(preset=preset, quick=True), params) == (4, 8, 24)


def test_bf16_tracks_fp32(tiny_dir):
    result = bf16_vs_fp32(tiny_dir("llama"), steps=3, batch_size=4, prompt_len=6, completion_len=10)
    assert len(result["loss_fp32"]) == len(result["loss_bf16"]) == 6          # mu = 2 steps per rollout
    assert result["loss_max_dev"] <= 0.05 and result["nll_max_rel_dev"] <= 0.05
    assert result["loss_fp32"] != result["loss_bf16"]                        # bf16 really was used
