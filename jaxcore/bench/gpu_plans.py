"""The memory planner against XLA's GPU compiler at the sizes users train at, compiled without a GPU.

Two configurations: EGGROLL at the Llama-3-8B shape on 8 x A100-40GB (the mission's headline) and GRPO at
Qwen2.5-1.5B on 8 x H100. Each phase of a run is a set of compiled programs plus the buffers that outlive them;
XLA's figure for a phase is the largest of its programs' per-device bytes (arguments + outputs + temporaries -
aliased) plus XLA's size of what is held across it, and the run's peak is the largest phase, as `jaxcore plan`
adds its terms (`MemoryPlan.total`):

- ES generation: the population's prefill or decode loop (compute weights, factors, KV cache, activations), with
  the masters (every parameter's, as `shard_masters` keeps them, not only the perturbed ones the update reads) and
  the optimizer state held;
- ES update: the gradient from regenerated factors, then the optimizer step on the sharded masters, with the
  compute weights held (the plan keeps them for the next epoch);
- GRPO training: the train step (its arguments are the masters and AdamW moments);
- GRPO generation: the prefill or decode loop of the bf16 compute copy, with the masters and moments held.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxcore.bench import gpu_compile, peak_bytes
from jaxcore.model.state import flat_state


@dataclasses.dataclass(frozen=True)
class ESRun:
    preset: str = "llama3-8b"
    target: str = "a100-40"
    devices: int = 8
    population: int = 256
    prompts: int = 4
    prompt_tokens: int = 128
    new_tokens: int = 256
    model_axis: int = 1
    optimizer: str = "adam"


@dataclasses.dataclass(frozen=True)
class GRPORun:
    preset: str = "qwen2.5-1.5b"
    target: str = "h100"
    devices: int = 8
    prompts: int = 8
    generations: int = 8
    prompt_tokens: int = 128
    new_tokens: int = 256


def _stats(lowered: Any) -> tuple[Any, str]:
    compiled = lowered.compile()
    return compiled.memory_analysis(), compiled.as_text()


def _report(planned: Any, phases: dict[str, int], collectives: dict[str, dict[str, int]], card: float
            ) -> dict[str, Any]:
    xla = max(phases.values())
    plan_phases = {phase: planned.persistent + total for phase, total in planned.phase_totals().items()}
    return {"plan_bytes": planned.total, "xla_bytes": xla, "plan_over_xla": round(planned.total / xla, 3),
            "xla_phase_bytes": phases, "plan_phase_bytes": plan_phases,
            "plan_over_xla_by_phase": {phase: round(plan_phases[phase] / v, 3) for phase, v in phases.items()},
            "device_memory_bytes": card, "fits": xla <= card, "collectives": collectives}


def es_plan_check(run: ESRun = ESRun()) -> dict[str, Any]:
    """`plan_es` beside XLA's per-device memory of the ES epoch's programs on `run.devices` x `run.target`."""
    from jaxcore.bench import gpu_targets
    from jaxcore.bench.hlo import collective_counts, summed_counts
    from jaxcore.es import memory as es_memory
    from jaxcore.parallel import meshes

    devices = gpu_targets.topology_devices(run.target, run.devices)
    mesh = meshes.es_mesh(run.model_axis, devices)
    config = gpu_compile.model_config(run.preset)
    card = gpu_targets.device_memory(run.target)
    planned = es_memory.plan_es(config, population=run.population, rank=1, prompts=run.prompts, generations=1,
                                prompt_tokens=run.prompt_tokens, max_new_tokens=run.new_tokens, devices=run.devices,
                                model_axis=run.model_axis, compute_dtype="bfloat16", optimizer=run.optimizer,
                                device_memory=card, platform="gpu")
    model = gpu_compile.placed_model(config, mesh, "bfloat16", meshes.MODEL)
    population, _ = gpu_compile.placed_population(model, mesh, run.population, meshes.POP)
    work = gpu_compile.Workload(rows=run.population * run.prompts, prompt=run.prompt_tokens,
                                new_tokens=run.new_tokens)
    generation = [_stats(x) for x in gpu_compile.lower_generate(population, mesh, work, meshes.POP)]
    gradient, update = (_stats(x) for x in gpu_compile.lower_es_update(config, mesh, run.population, run.optimizer))
    gradient_bytes = gradient[0].output_size_in_bytes
    others = _masters_bytes(config, mesh) - gradient_bytes        # the masters no update reads (g: the perturbed)
    held = others + update[0].argument_size_in_bytes - gradient_bytes     # every master and the optimizer state
    compute_weights = sum(_shard_bytes(x) for x in _weights(model))
    phases = {"generation": held + max(peak_bytes(s) for s, _ in generation),
              "update": compute_weights + max(held + peak_bytes(gradient[0]), others + peak_bytes(update[0]))}
    collectives = {"generation": summed_counts(collective_counts(t) for _, t in generation),
                   "update": summed_counts(collective_counts(t) for _, t in (gradient, update))}
    return {"run": dataclasses.asdict(run), **_report(planned, phases, collectives, card)}


def grpo_plan_check(run: GRPORun = GRPORun()) -> dict[str, Any]:
    """`plan_grpo` beside XLA's per-device memory of a GRPO step's programs on `run.devices` x `run.target`."""
    from jaxcore.bench import gpu_targets
    from jaxcore.bench.hlo import collective_counts, summed_counts
    from jaxcore.grpo import memory as grpo_memory
    from jaxcore.parallel import meshes

    devices = gpu_targets.topology_devices(run.target, run.devices)
    mesh = meshes.grpo_mesh(1, devices)
    config = gpu_compile.model_config(run.preset)
    card = gpu_targets.device_memory(run.target)
    planned = grpo_memory.plan_grpo(config, prompts=run.prompts, generations=run.generations,
                                    prompt_tokens=run.prompt_tokens, max_new_tokens=run.new_tokens,
                                    devices=run.devices, compute_dtype="bfloat16", device_memory=card,
                                    platform="gpu", share_prompts=True)
    rows = run.prompts * run.generations
    learner = gpu_compile.grpo_learner(config, mesh, "bfloat16", **{"rollout.generations_per_prompt": run.generations})
    work = gpu_compile.Workload(rows=rows, prompt=run.prompt_tokens, new_tokens=run.new_tokens)
    batch = gpu_compile.grpo_step_batch(learner, work)                # packed as the run's (prefix trees)
    step, step_text = _stats(learner.lower_step(batch, jnp.float32(1.0)))
    held = step.argument_size_in_bytes - sum(map(_shard_bytes, jax.tree.leaves(batch)))   # masters, AdamW moments
    model = gpu_compile.placed_model(config, mesh, "bfloat16")
    generation = [_stats(x) for x in gpu_compile.lower_generate(model, mesh, work, meshes.DATA)]
    phases = {"training": peak_bytes(step), "generation": held + max(peak_bytes(s) for s, _ in generation)}
    collectives = {"training": collective_counts(step_text),
                   "generation": summed_counts(collective_counts(t) for _, t in generation)}
    return {"run": dataclasses.asdict(run), **_report(planned, phases, collectives, card)}


def _masters_bytes(config: Any, mesh: Any) -> int:
    """Per-device bytes of ES's fp32 masters of every parameter on `mesh` (`sharding.master_spec`)."""
    import numpy as np

    from jaxcore.model.transformer import abstract_model
    from jaxcore.parallel import sharding

    total = 0
    for path, x in flat_state(abstract_model(config)).items():
        spec = sharding.master_spec(path, tuple(x.shape), mesh, head_dim=config.head_dim)
        total += int(np.prod(NamedSharding(mesh, spec).shard_shape(x.shape))) * 4
    return total


def _shard_bytes(x: Any) -> int:
    import numpy as np

    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    return int(np.prod(shape)) * jnp.dtype(x.dtype).itemsize


def _weights(model: Any) -> list[Any]:
    return list(flat_state(model).values())
