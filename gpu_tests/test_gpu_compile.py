"""Counts as guards, read from programs compiled for the H100 and the A100 on this CPU host (issue 48, item 4):
kernels per transformer layer of every hot program (the GRPO step's include its all-reduces on 8 GPUs), and the
collectives of the 8-GPU layouts.

The bounds are today's counts at the bench shape (hidden 512, bf16, 64 rows; `jaxcore.bench.gpu_compile`): a
change that adds a kernel to a layer of a hot program, or a collective to a step, fails here. Lower a count and
lower its bound with it (docs/benchmarks.md keeps the current figures). The decode step's targets are 8 kernels a
layer (plain) and 10 (population); the fused attention kernel took them from 15.5 and 20.5 (H100; A100: 15 and 23)
to the bounds below.
"""

from __future__ import annotations

import pytest

from jaxcore.bench import gpu_compile, gpu_targets

# (program, target): the most kernels one layer may launch
KERNELS_PER_LAYER = {
    ("decode", "h100"): 10.0, ("decode", "a100-40"): 10.0,
    ("decode_population", "h100"): 14.0, ("decode_population", "a100-40"): 18.0,
    ("prefill", "h100"): 18.0, ("prefill", "a100-40"): 18.0,
    ("grpo_step", "h100"): 141.0, ("grpo_step", "a100-40"): 130.5,
    ("es_generate", "h100"): 43.0, ("es_generate", "a100-40"): 51.0,
    ("es_update", "h100"): 48.5, ("es_update", "a100-40"): 48.5,
}
# program: the most collectives of each kind one run sends at 4 layers on 8 GPUs
COLLECTIVES = {
    "decode": {}, "decode_population": {}, "prefill": {},
    "grpo_step": {"all-reduce": 9},                        # the gradients, bucketed by XLA
    "es_generate": {"all-gather": 4},
    "es_update": {"all-gather": 1, "collective-permute": 25, "all-reduce": 1},
}


@pytest.fixture(scope="module", params=["h100", "a100-40"])
def compiled(request):
    """{program: (kernels per layer, the 4-layer program's figures)} for one target."""
    target = request.param
    builders = gpu_compile.program_builders("bench", gpu_targets.topology_devices(target, 8), gpu_compile.Workload())
    return target, {name: gpu_compile.per_layer(builders[name]) for name in gpu_compile.PROGRAMS}


@pytest.mark.parametrize("program", gpu_compile.PROGRAMS)
def test_kernels_per_layer_stay_within_todays_counts(compiled, program):
    target, figures = compiled
    per_layer, deep = figures[program]
    assert 0 < per_layer <= KERNELS_PER_LAYER[program, target], (program, target, per_layer)
    assert deep.memory_bytes > 0


@pytest.mark.parametrize("program", gpu_compile.PROGRAMS)
def test_collectives_stay_within_todays_counts(compiled, program):
    target, figures = compiled
    sent = figures[program][1].collectives
    most = COLLECTIVES[program]
    assert set(sent) <= set(most) and all(n <= most[op] for op, n in sent.items()), (program, target, sent)
