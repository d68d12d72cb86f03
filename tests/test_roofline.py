"""Exact byte/FLOP counts of jaxcore.bench.roofline against hand-computed numbers (no timings)."""

import pytest

from jaxcore.bench import roofline
from jaxcore.tiny import PRESETS, preset_config

# q 8x8, k/v 8x4, o 8x8, gate/up 8x16, down 16x8 = 576 per layer; 2 layers + LM head 10x8 = 1232
SHAPE = roofline.Shape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tie=False)


def test_param_counts_by_hand():
    assert SHAPE.matmul_params() == 2 * 576 + 80
    assert SHAPE.vector_params() == 2 * 16 + 8
    assert SHAPE.total_params() == 1232 + 40 + 80


def test_decode_step_by_hand():
    step = roofline.decode_step(SHAPE, batch=3, length=5, itemsize=2)
    weights = (1232 + 40) * 2 + 3 * 8 * 2                 # + the 3 gathered embedding rows
    kv = 2 * 2 * 3 * 5 * 1 * 4 * 2 + 2 * 2 * 3 * 1 * 1 * 4 * 2   # read 5 positions, write 1
    assert step["bytes"] == weights + kv == 3168
    # matmuls 2 * 3 * 1232; attention 2 (QK, PV) * 2 * layers 2 * batch 3 * heads 2 * hd 4 * 6 keys
    assert step["flops"] == 2 * 3 * 1232 + 2 * 2 * 2 * 3 * 2 * 4 * 6 == 8544


def test_factors_and_generation_sum():
    step = roofline.decode_step(SHAPE, 3, 5, 2, factor_targets=[(8, 8)], rank=2)
    plain = roofline.decode_step(SHAPE, 3, 5, 2)
    assert step["bytes"] - plain["bytes"] == 3 * 2 * (8 + 8) * 2
    assert step["flops"] - plain["flops"] == 2 * 3 * 2 * (8 + 8)
    total = roofline.generation(SHAPE, 3, 4, 3, 2)
    parts = [roofline.prefill(SHAPE, 3, 4, 2), roofline.decode_step(SHAPE, 3, 4, 2),
             roofline.decode_step(SHAPE, 3, 5, 2)]
    assert total == {k: sum(p[k] for p in parts) for k in total}
    # causal prefill of 4 tokens sees 1 + 2 + 3 + 4 = 10 keys
    assert roofline.attention_flops(SHAPE, 3, 4, 0) == 2 * 2 * 2 * 3 * 2 * 4 * 10


def test_limit_picks_the_binding_side():
    peaks = {"bandwidth_bytes_per_s": 100.0, "matmul_flops_per_s": 1000.0}
    entry = roofline.limit({"bytes": 200, "flops": 1000}, peaks, measured_s=4.0)
    assert entry["bound"] == "memory" and entry["limit_s"] == 2.0 and entry["fraction_of_limit"] == 0.5
    entry = roofline.limit({"bytes": 100, "flops": 3000}, peaks, measured_s=4.0)
    assert entry["bound"] == "compute" and entry["fraction_of_limit"] == 0.75


@pytest.mark.parametrize("preset, params", [("smollm2-135m", 134_515_008), ("qwen2.5-0.5b", 494_032_768),
                                            ("qwen2.5-1.5b", 1_543_714_304), ("llama3-8b", 8_030_261_248)])
def test_real_shapes_match_published_parameter_counts(preset, params):
    cfg = preset_config(preset)
    assert cfg["hidden_size"] == PRESETS[preset]["hidden"]
    assert roofline.Shape.from_hf(cfg).total_params() == params


def test_model_shape_counts_a_loaded_model(tmp_path):
    import jaxcore
    from jaxcore.convert import flat_state
    from jaxcore.tiny import write_tiny_checkpoint

    model = jaxcore.load_hf(write_tiny_checkpoint(tmp_path / "m", "qwen2"))
    assert roofline.model_shape(model).total_params() == sum(int(v.size) for v in flat_state(model).values())
