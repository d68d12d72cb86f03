"""What a GRPO step sends between devices, counted in its compiled program on 8 simulated devices (issue 41,
item 4), so that the first run on several GPUs holds no surprise: with rows over the 8 devices (data parallel)
the step all-reduces every gradient exactly once (the reduced f32 elements are the parameter count, plus a few
scalars) and gathers no weight."""

from __future__ import annotations

import math

from hlo_collectives import collectives, f32_elements
from test_step_cost import MAX_NEW, REAL, compiled_step, rollout_batch

import jaxcore
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.model.state import flat_state
from jaxcore.parallel import meshes


def test_a_data_parallel_grpo_step_reduces_every_gradient_once(tiny_dir, grpo_job):
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, generations_per_prompt=4)
    learner = GRPOLearner(model, cfg, mesh=meshes.grpo_mesh(1))
    assert learner.mesh.size == 8
    found = collectives(compiled_step(learner, rollout_batch(cfg, [9, 8], REAL)).as_text())
    params = sum(math.prod(v.shape) for v in flat_state(model).values())
    assert params <= f32_elements(found["all-reduce"]) <= params + 64, (params, f32_elements(found["all-reduce"]))
    assert not found["all-gather"] and not found["reduce-scatter"]       # replicated weights: nothing to gather
