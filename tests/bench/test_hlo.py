"""The HLO reader behind the GPU kernel counts (`jaxcore.bench.hlo`), on programs compiled here (XLA:CPU) and on
a hand-written GPU-style module: what counts as a kernel, loops by their trip counts, collectives, bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.bench import hlo

GPU_STYLE = """HloModule jit_step, entry_computation_layout={(f32[8,16]{1,0})->f32[8,16]{1,0}}

%fused_add (param_0: f32[8,16]) -> f32[8,16] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  ROOT %add.1 = f32[8,16]{1,0} add(%param_0, %param_0)
}

%fused_update (param_0.1: f32[8,64], param_1: f32[8,16], param_2: s32[]) -> f32[8,64] {
  %param_0.1 = f32[8,64]{1,0} parameter(0)
  %param_1 = f32[8,16]{1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[8,64]{1,0} dynamic-update-slice(%param_0.1, %param_1, %c, %param_2)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %f = f32[8,16]{1,0} fusion(%x), kind=kLoop, calls=%fused_add
  %r = f32[8,16]{1,0} all-reduce-start(%f), replica_groups={}, to_apply=%fused_add
  %d = f32[8,16]{1,0} all-reduce-done(%r)
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %d)
}

%cond (p.1: (s32[], f32[8,16])) -> pred[] {
  %p.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (a: f32[8,16], cache: f32[8,64], index: s32[]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %cache = f32[8,64]{1,0} parameter(1)
  %index = s32[] parameter(2)
  %g = (f32[8,16]{1,0}, s8[1024]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm"
  %g0 = f32[8,16]{1,0} get-tuple-element(%g), index=0
  %u = f32[8,64]{1,0} fusion(%cache, %g0, %index), kind=kLoop, calls=%fused_update
  %b = f32[8,16]{1,0} bitcast(%g0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}) tuple(%zero, %b)
  %w = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%w), index=1
}
"""


def test_kernels_count_fusions_library_calls_and_loop_bodies_by_trip_count():
    counts = hlo.kernel_counts(GPU_STYLE)
    # the gemm and the in-place update once; the loop's fusion and all-reduce three times; nothing for
    # parameters, constants, bitcasts, tuples, the loop itself or the all-reduce's completion
    assert dict(counts) == {"custom-call": 1, "fusion": 1 + 3, "all-reduce-start": 3}, counts
    assert hlo.kernels(GPU_STYLE) == 8
    assert hlo.collective_counts(GPU_STYLE) == {"all-reduce": 3}
    assert hlo.collectives(GPU_STYLE) == {"all-reduce": [[("f32", 128)]]}
    assert hlo.collectives(GPU_STYLE)["all-gather"] == []                 # one it does not send reads as none


def test_kernel_bytes_count_an_in_place_update_as_its_update_and_leave_out_library_scratch():
    # gemm: reads a twice (2 x 512 B) and writes 512 B (its 1 KiB workspace left out); the cache update reads and
    # writes the 512 B update and the index, not the 2 KiB cache
    assert hlo.kernel_bytes(GPU_STYLE) == 3 * 512 + 2 * (512 + 4)


def test_a_cpu_program_with_a_scan_counts_its_body_per_iteration():
    def program(x, steps):
        def body(carry, _):
            return jnp.tanh(carry @ carry), None
        return jax.lax.scan(body, x, None, length=steps)[0]

    x = jnp.ones((16, 16), jnp.float32)
    counts = [hlo.kernels(jax.jit(program, static_argnums=1).lower(x, n).compile().as_text()) for n in (3, 7)]
    assert counts[1] > counts[0] and (counts[1] - counts[0]) % 4 == 0, counts


def test_the_collectives_of_a_sharded_sum():
    mesh = jax.make_mesh((8,), ("d",))
    x = jax.device_put(np.ones((8, 4), np.float32), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    text = jax.jit(lambda x: x.sum(0)).lower(x).compile().as_text()
    assert set(hlo.collectives(text)) == {"all-reduce"}
    assert hlo.collective_counts(text) == {"all-reduce": len(hlo.collectives(text)["all-reduce"])}
