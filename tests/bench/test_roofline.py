"""Exact byte/FLOP counts of jaxcore.bench.roofline against hand-computed numbers (no timings)."""

import math

import pytest

from jaxcore.bench import roofline
from jaxcore.hf.tiny import PRESETS, preset_config

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


def test_prefill_runs_the_lm_head_at_the_last_position_only():
    """generate()'s prefill computes logits for the last position (last_only=True): 12 prompt tokens go
    through the 1152 layer-matmul parameters, but only 3 rows (one per prompt) through the 10 x 8 head."""
    work = roofline.prefill(SHAPE, batch=3, prompt_len=4, itemsize=2)
    layers = 2 * 12 * 1152
    head = 2 * 3 * 80
    attention = 2 * 2 * 2 * 3 * 2 * 4 * 10                # causal: 1 + 2 + 3 + 4 = 10 keys per row
    assert work["flops"] == layers + head + attention == 30048
    # weights once + 12 gathered rows + the prompt's K and V written (2 * layers 2 * 3 * 4 * kv 1 * hd 4)
    assert work["bytes"] == (1232 + 40) * 2 + 12 * 8 * 2 + 2 * 2 * 3 * 4 * 4 * 2 == 3120


def test_factors_are_stored_once_per_antithetic_pair():
    # population 4 = 2 pairs; rank 2; one 8 x 8 matrix; 2-byte factors: 2 pairs * 2 * (8 + 8) * 2 bytes
    step = roofline.decode_step(SHAPE, 4, 5, 2, factor_targets=[(8, 8)], rank=2)
    plain = roofline.decode_step(SHAPE, 4, 5, 2)
    assert step["bytes"] - plain["bytes"] == 128
    # but every member's row does the rank-2 term: 4 rows * 2 FLOPs * 2 * (8 + 8)
    assert step["flops"] - plain["flops"] == 256
    assert roofline.factor_bytes([(8, 8), (8, 16)], 6, 1, 4) == 3 * (16 + 24) * 4


def test_generation_is_a_prefill_then_decode_steps():
    phases = roofline.generation(SHAPE, 3, 4, 3, 2)
    assert [name for name, _ in phases] == ["prefill", "decode", "decode"]
    assert phases[0][1] == roofline.prefill(SHAPE, 3, 4, 2)
    assert phases[1][1] == roofline.decode_step(SHAPE, 3, 4, 2)
    assert phases[2][1] == roofline.decode_step(SHAPE, 3, 5, 2)
    assert roofline.decode_phases(SHAPE, 3, 4, 3, 2) == phases[1:]
    assert roofline.totals(phases) == {k: sum(w[k] for _, w in phases) for k in ("bytes", "flops")}


def test_limit_picks_the_binding_side():
    peaks = {"bandwidth_bytes_per_s": 100.0, "matmul_flops_per_s": 1000.0}
    entry = roofline.limit({"bytes": 200, "flops": 1000}, peaks, measured_s=4.0)
    assert entry["bound"] == "memory" and entry["limit_s"] == 2.0 and entry["fraction_of_limit"] == 0.5
    entry = roofline.limit({"bytes": 100, "flops": 3000}, peaks, measured_s=4.0)
    assert entry["bound"] == "compute" and entry["fraction_of_limit"] == 0.75


def test_limit_sums_each_phases_own_bound():
    """A compute-bound prefill (3 s of FLOPs, 1 s of bytes) and two memory-bound decode steps (1 s of
    bytes, 0.05 s of FLOPs each) cannot overlap: the limit is 3 + 1 + 1 = 5 s, not max(3 s of bytes,
    3.1 s of FLOPs) over the run's totals."""
    peaks = {"bandwidth_bytes_per_s": 100.0, "matmul_flops_per_s": 1000.0}
    phases = [("prefill", {"bytes": 100, "flops": 3000}), ("decode", {"bytes": 100, "flops": 50}),
              ("decode", {"bytes": 100, "flops": 50})]
    entry = roofline.limit(phases, peaks, measured_s=10.0)
    assert entry["limit_s"] == pytest.approx(5.0) and entry["fraction_of_limit"] == 0.5
    assert entry["memory_s"] == pytest.approx(3.0) and entry["compute_s"] == pytest.approx(3.1)
    assert entry["bytes"] == 300 and entry["flops"] == 3100
    assert entry["phases"]["prefill"] == {"count": 1, "bytes": 100, "flops": 3000, "limit_s": 3.0, "bound": "compute"}
    assert entry["phases"]["decode"]["count"] == 2 and entry["phases"]["decode"]["bound"] == "memory"
    assert entry["bound"] == "compute"                 # 3 s of the 5 s limit is the compute-bound prefill


def test_fraction_keeps_significant_digits():
    entry = roofline.limit({"bytes": 1, "flops": 1}, {"bandwidth_bytes_per_s": 1.0, "matmul_flops_per_s": 1.0},
                           measured_s=123456.0)
    assert entry["fraction_of_limit"] == pytest.approx(8.1e-6, rel=1e-3)


def test_real_generation_limit_exceeds_the_totals_limit():
    """At a real shape the prefill is compute-bound and the decode memory-bound, so summing per phase
    gives more than max(bytes, FLOPs) over the totals (the bench measured ERR1's understatement)."""
    shape = roofline.Shape.from_hf(preset_config("qwen2.5-0.5b"))
    peaks = {"bandwidth_bytes_per_s": 3.0e12, "matmul_flops_per_s": 7.0e14}
    entry = roofline.limit(roofline.generation(shape, 256, 64, 256, 2), peaks, measured_s=1.0)
    assert entry["phases"]["prefill"]["bound"] == "compute" and entry["phases"]["decode"]["bound"] == "memory"
    assert entry["limit_s"] > max(entry["memory_s"], entry["compute_s"]) * 1.05


@pytest.mark.parametrize("preset, params", [("smollm2-135m", 134_515_008), ("qwen2.5-0.5b", 494_032_768),
                                            ("qwen2.5-1.5b", 1_543_714_304), ("llama3-8b", 8_030_261_248)])
def test_real_shapes_match_published_parameter_counts(preset, params):
    cfg = preset_config(preset)
    assert cfg["hidden_size"] == PRESETS[preset]["hidden"]
    assert roofline.Shape.from_hf(cfg).total_params() == params


def test_gpt2_and_qwen3_match_published_parameter_counts():
    """GPT-2 small (ungated gelu MLP, LayerNorm biases, biases everywhere, 1024 learned positions, tied)
    and Qwen3-0.6B (q/k norms, head_dim 128 != hidden / heads, tied)."""
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
            "vocab_size": 50257, "tie_word_embeddings": True}
    shape = roofline.Shape.from_hf(gpt2)
    assert shape.total_params() == 124_439_808
    assert len(shape.layer_matrices()) == 6 and shape.gathered_rows() == 2
    qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
             "tie_word_embeddings": True}
    assert roofline.Shape.from_hf(qwen3).total_params() == 596_049_920


def test_gpt2_decode_reads_the_position_row_and_no_gate():
    shape = roofline.Shape(hidden=8, layers=1, heads=2, kv_heads=2, head_dim=4, intermediate=32, vocab=10,
                           tie=True, qkv_bias=True, gated=False, out_bias=True, mlp_bias=True, layer_norm=True,
                           positions=16)
    # q, k, v, o 8 x 8 each + up 8 x 32 + down 32 x 8, + LM head 10 x 8
    assert shape.matmul_params() == 4 * 64 + 2 * 256 + 80
    # 2 LayerNorms (16 each) + qkv bias 24 + out bias 8 + up bias 32 + down bias 8 + final LayerNorm 16
    assert shape.vector_params() == 32 + 24 + 8 + 40 + 16
    step = roofline.decode_step(shape, batch=1, length=0, itemsize=1)
    assert step["bytes"] == 848 + 120 + 2 * 8 + 2 * 8    # weights, vectors, token + position rows, K/V write


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gpt2"])
def test_model_shape_counts_a_loaded_model(tiny_dir, family):
    import jaxcore
    from jaxcore.model.state import flat_state

    model = jaxcore.load_hf(tiny_dir(family))
    shape = roofline.model_shape(model)
    assert shape.total_params() == sum(int(v.size) for v in flat_state(model).values())
    assert shape.gated == (family != "gpt2") and shape.qk_norm == (family == "qwen3")


def test_measure_peaks_tiny_sizes():
    peaks = roofline.measure_peaks("float32", copy_bytes=1 << 20, gemm_n=64, repeats=1)
    for key in ("bandwidth_bytes_per_s", "matmul_flops_per_s"):
        assert math.isfinite(peaks[key]) and peaks[key] > 0
    assert peaks["copy_bytes"] == 1 << 20 and peaks["gemm_n"] == 64 and peaks["dtype"] == "float32"


def test_peaks_for_keeps_the_best_measurement(monkeypatch):
    """A suite re-measures after its timings; a measurement taken under load must not lower the peaks."""
    readings = iter([(10.0, 50.0), (20.0, 40.0), (5.0, 5.0)])

    def fake(dtype, **sizes):
        bw, flops = next(readings)
        return {"bandwidth_bytes_per_s": bw, "matmul_flops_per_s": flops, "dtype": dtype}

    monkeypatch.setattr(roofline, "measure_peaks", fake)
    monkeypatch.setattr(roofline, "_PEAKS", {})
    monkeypatch.setattr(roofline, "_MEASUREMENTS", {})
    first = roofline.peaks_for("float32")
    assert (first["bandwidth_bytes_per_s"], first["matmul_flops_per_s"]) == (10.0, 50.0)
    assert roofline.peaks_for("float32") is first                       # no refresh: no new measurement
    best = roofline.peaks_for("float32", refresh=True)
    assert (best["bandwidth_bytes_per_s"], best["matmul_flops_per_s"]) == (20.0, 50.0)
    best = roofline.peaks_for("float32", refresh=True)
    assert (best["bandwidth_bytes_per_s"], best["matmul_flops_per_s"]) == (20.0, 50.0)
    assert best["measurements"] == 3 and len(roofline.peak_measurements("float32")) == 3


def test_reprice_recomputes_entries_with_new_peaks():
    roofline.forget_entries()
    slow = {"bandwidth_bytes_per_s": 100.0, "matmul_flops_per_s": 1000.0}
    phases = [("prefill", {"bytes": 100, "flops": 3000}), ("decode", {"bytes": 100, "flops": 50})]
    entry = roofline.limit(phases, slow, measured_s=8.0)
    assert entry["limit_s"] == pytest.approx(4.0) and entry["mfu"] == pytest.approx(3050 / 8.0 / 1000.0, rel=1e-3)
    # twice the compute: the prefill drops to 1.5 s, the decode stays 1 s
    assert roofline.reprice({"bandwidth_bytes_per_s": 100.0, "matmul_flops_per_s": 2000.0}) == 1
    assert entry["limit_s"] == pytest.approx(2.5) and entry["fraction_of_limit"] == pytest.approx(2.5 / 8.0)
    assert entry["phases"]["prefill"]["limit_s"] == pytest.approx(1.5) and entry["measured_s"] == 8.0
    assert entry["peaks"]["matmul_flops_per_s"] == 2000.0
    roofline.forget_entries()
