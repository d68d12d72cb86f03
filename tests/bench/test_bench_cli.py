"""`jaxcore bench --quick --json F` end to end: the JSON names the device, carries the measured peaks,
and every generate/ES figure has a roofline entry with a fraction of the limit (no timed assertions)."""

import json

import pytest

from jaxcore.cli import main
from jaxcore.commands.bench import default_dtype


def check_roofline(entry: dict, phases: tuple[str, ...]) -> None:
    assert {"bytes", "flops", "limit_s", "memory_s", "compute_s", "bound", "measured_s",
            "fraction_of_limit"} <= set(entry)
    assert entry["bytes"] > 0 and entry["flops"] > 0 and entry["limit_s"] > 0 and entry["measured_s"] > 0
    assert 0 < entry["fraction_of_limit"] <= 1.5
    assert entry["limit_s"] >= max(entry["memory_s"], entry["compute_s"]) * (1 - 1e-9)
    assert tuple(entry["phases"]) == phases
    assert entry["limit_s"] == pytest.approx(sum(p["limit_s"] for p in entry["phases"].values()))


def test_bench_cli_quick_json(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--suite", "generate,es", "--quick", "--json", str(out),
                 "--workdir", str(tmp_path / "models")]) == 0
    result = json.loads(out.read_text())
    assert result["device"]["device"].startswith("cpu") and result["device"]["num_devices"] >= 1
    assert result["options"]["dtype"] == "float32" and result["options"]["quick"]
    peaks = result["peaks"]
    assert peaks["bandwidth_bytes_per_s"] > 0 and peaks["matmul_flops_per_s"] > 0
    assert result["generate.jax_over_hf"] > 0
    check_roofline(result["generate.jax_roofline"], ("prefill", "decode"))
    decode = result["generate.decode_roofline"]
    check_roofline(decode, ("decode",))
    assert decode["measured_s"] == pytest.approx(result["generate.jax_roofline"]["measured_s"]
                                                 - result["generate.prefill_s"])
    assert decode["phases"]["decode"]["count"] == result["generate.shape"]["new_tokens"] - 1
    for key in ("es.population_roofline", "es.inference_roofline", "es.naive_member_roofline"):
        check_roofline(result[key], ("prefill", "decode"))
    # the population also reads its factors: more bytes than plain inference at the same batch
    assert result["es.population_roofline"]["bytes"] > result["es.inference_roofline"]["bytes"]
    # one set of peaks per JSON: every entry is priced with the run's best measurement
    roofline_keys = [k for k in result if k.endswith("_roofline")]
    assert len(roofline_keys) == 5
    for key in roofline_keys:
        assert result[key]["peaks"] == {k: peaks[k] for k in ("bandwidth_bytes_per_s", "matmul_flops_per_s")}
    assert len(result["peak_measurements"]) == 3                       # the first, then one per suite
    assert result["es.eggroll_over_naive"] > 0 and result["es.eggroll_over_naive_bound"] > 0
    assert 0 <= result["es.naive_materialise_share"] < 1


def test_default_dtype_is_bf16_on_gpu_only():
    assert default_dtype("gpu") == "bfloat16" and default_dtype("cuda") == "bfloat16"
    assert default_dtype("cpu") == "float32"
