"""`jaxcore bench --suite compile`: what making each program group costs at each depth, one fresh process per
depth (quick shapes on the tiny model, at one small depth)."""

from jaxcore.bench import BenchOptions
from jaxcore.bench import compile as compile_bench


def test_compile_suite_counts_every_program_group_at_every_depth():
    """Every group (the GRPO step scanned and per layer, generation, an ES epoch) is seen being traced, lowered and
    compiled, from the first program the process makes on (a ledger that starts listening late
    reads the scanned step, made first, as nothing: the suite's first version reported 0 s there)."""
    results = compile_bench.run(BenchOptions(quick=True), depths=(2,))
    for layers in (2,):
        for program in compile_bench.PROGRAMS:
            made = results[f"compile.{program}.L{layers}"]
            assert made["programs"] >= 1 and made["trace_s"] > 0 and made["compile_s"] > 0, (program, made)
            assert made["seconds"] >= made["trace_s"] + made["compile_s"] - 1e-3
    assert all(results[f"compile.{program}.2_over_2"] > 0 for program in compile_bench.PROGRAMS)
