"""`jaxcore bench --suite gpu-compile`: the hot programs compiled for a named GPU on any host (no GPU needed),
with what the compiler decided about them.

For each program (the decode step, plain and for an EGGROLL population, the prefill, the GRPO train step, the ES
epoch's generation and its update) it reports the kernels one run launches per transformer layer (from models of
2 and 4 layers: the per-kernel cost a GPU pays on every layer and token), the collectives on the `--devices`-GPU
topology, and XLA's per-device memory. The decode step's bytes come with the HBM roofline of the target.
Autotuning cannot run without a GPU, so GEMM tiling is XLA's default; fusion, kernel counts, collectives and
buffer sizes are the compiler's own. `plans` compiles the two configurations the memory planner must get right
on their hardware (ES at the Llama-3-8B shape on 8 x A100-40GB, GRPO at Qwen2.5-1.5B on 8 x H100) and sets
`jaxcore plan`'s estimate beside XLA's figure.

Every builder takes abstract inputs only (shapes with placements), so nothing is allocated at any model size.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcore.bench import hlo, peak_bytes

PROGRAMS = ("decode", "decode_population", "prefill", "grpo_step", "es_generate", "es_update")
# the decode step on XLA's ops alone (`decode_attention="xla"`), for comparison with the fused kernel a GPU runs
REFERENCE_PROGRAMS = ("decode_xla", "decode_population_xla")
DEPTHS = (2, 4)                     # kernels per layer: the difference between these two depths, halved
ES_PROMPTS = 8                      # prompts each member answers in the ES epoch compiled here


@dataclasses.dataclass(frozen=True)
class Workload:
    """The shapes a program is compiled at: rows (the population for ES), prompt and completion tokens."""

    rows: int = 64
    prompt: int = 16
    new_tokens: int = 32
    dtype: str = "bfloat16"


# -------------------------------------------------------------------------------------------- placement


def abstract(x: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def placed_model(config: Any, mesh: Mesh, dtype: str, model_axis: str | None = None) -> Any:
    """An abstract model (`abstract_model`) whose weights carry their placement: tensor-parallel over
    `model_axis` (ES's compute weights) or replicated."""
    from jaxcore.model.state import flat_state, variable_at
    from jaxcore.model.transformer import abstract_model
    from jaxcore.parallel import sharding

    model = abstract_model(config, dtype=dtype, param_dtype=dtype)
    size = mesh.shape[model_axis] if model_axis else 1
    for path, value in flat_state(model).items():
        spec = (sharding.tensor_parallel_spec(path, tuple(value.shape), model_axis, size, config.head_dim)
                if model_axis else P())
        variable_at(model, path).set_value(abstract(value, NamedSharding(mesh, spec)))
    return model


def placed_population(model: Any, mesh: Mesh, population: int, row_axis: str | None) -> tuple[Any, Any]:
    """The EGGROLL population of `placed_model` (rank 1) as abstract arrays: each factor placed like its weight
    (`sharding.factor_specs`), pairs over `row_axis`; and its noise plan."""
    from jaxcore.es import eggroll
    from jaxcore.es.population import MemberNoise, perturbed_model
    from jaxcore.model.state import variable_at
    from jaxcore.parallel import sharding

    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=population, rank=1))
    noise = jax.eval_shape(lambda p: eggroll.member_noise(p, jnp.int32(0), dtype=model.dtype), plan)
    low_rank = {}
    for path, (a, b) in noise.low_rank.items():
        a_spec, b_spec = sharding.factor_specs(variable_at(model, path).get_value().sharding.spec, row_axis)
        low_rank[path] = (abstract(a, NamedSharding(mesh, a_spec)), abstract(b, NamedSharding(mesh, b_spec)))
    return perturbed_model(model, MemberNoise(low_rank, {})), plan


def _cache_of(model: Any, ids: Any, cache_length: int) -> Any:
    from jaxcore.inference.generate import prefill

    return jax.eval_shape(functools.partial(prefill, cache_length=cache_length), model, ids, ids)


# -------------------------------------------------------------------------------------------- the programs


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def decode_step(graphdef: nnx.GraphDef, state: nnx.State, cache: Any, token_B: jax.Array, position_B: jax.Array,
                index: jax.Array) -> tuple[jax.Array, Any]:
    """One token per row through the cached model, as `generate`'s decode loop runs it."""
    model = nnx.merge(graphdef, state)
    logits_B1V, cache = model.forward_cached(token_B[:, None], position_B[:, None],
                                             jnp.ones_like(token_B, bool)[:, None], cache, index, last_only=True)
    return logits_B1V[:, 0], cache


def _rows(mesh: Mesh, row_axis: str | None) -> NamedSharding:
    return NamedSharding(mesh, P(row_axis) if row_axis else P())


def lower_decode(model: Any, mesh: Mesh, w: Workload, row_axis: str | None = None) -> list[Any]:
    """The decode step of `model` (plain or a population) at `w.rows` rows."""
    rows = _rows(mesh, row_axis)
    ids = jax.ShapeDtypeStruct((w.rows, w.prompt), jnp.int32, sharding=rows)
    _, cache = _cache_of(model, ids, w.prompt + w.new_tokens)
    cache = jax.tree.map(lambda x: abstract(x, rows), cache)
    graphdef, state = nnx.split(model)
    token = jax.ShapeDtypeStruct((w.rows,), jnp.int32, sharding=rows)
    index = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
    return [decode_step.lower(graphdef, state, cache, token, token, index)]


def lower_prefill(model: Any, mesh: Mesh, w: Workload, row_axis: str | None = None) -> list[Any]:
    from jaxcore.inference.generate import prefill

    ids = jax.ShapeDtypeStruct((w.rows, w.prompt), jnp.int32, sharding=_rows(mesh, row_axis))
    return [prefill.lower(model, ids, ids, cache_length=w.prompt + w.new_tokens)]


def lower_generate(model: Any, mesh: Mesh, w: Workload, row_axis: str | None = None) -> list[Any]:
    """A generation's two programs: the prefill and the decode loop (sampling at temperature 1, no log-probs)."""
    from jaxcore.inference import generate as generation
    from jaxcore.inference.sampling import SamplingConfig

    rows = _rows(mesh, row_axis)
    ids = jax.ShapeDtypeStruct((w.rows, w.prompt), jnp.int32, sharding=rows)
    prefill = generation.prefill.lower(model, ids, ids, cache_length=w.prompt + w.new_tokens)
    logits, cache = _cache_of(model, ids, w.prompt + w.new_tokens)
    logits_sharding, cache_sharding = prefill.compile().output_shardings
    cache = jax.tree.map(abstract, cache, cache_sharding)
    positions = jax.ShapeDtypeStruct((w.rows,), jnp.int32, sharding=rows)
    decode = generation.decode.lower(model, cache, abstract(logits, logits_sharding), positions, jnp.int32(w.prompt),
                                     jax.random.key(0), max_new_tokens=w.new_tokens, sampling=SamplingConfig(),
                                     eos_ids=(), pad_id=0, with_logprobs=False)
    return [prefill, decode]


def grpo_learner(config: Any, mesh: Mesh, dtype: str, **job: Any) -> Any:
    """An abstract `GRPOLearner` (shapes only) for `config` on `mesh` with TRL's defaults and `job`'s settings."""
    from jaxcore.grpo.config import GRPOConfig
    from jaxcore.grpo.learner import GRPOLearner
    from jaxcore.model.transformer import abstract_model

    cfg = GRPOConfig()
    for key, value in job.items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    return GRPOLearner(abstract_model(config), cfg, mesh=mesh, compute_dtype=dtype)


def grpo_step_batch(learner: Any, w: Workload) -> Any:
    """An abstract `GRPOBatch` of `w.rows` rows of prompt + completion placed over the learner's batch axes, a
    prompt per group of `rollout.generations_per_prompt` rows, packed as prefix trees where the learner's `grpo`
    packs (as a run's batches are)."""
    rows = NamedSharding(learner.mesh, P(learner.batch_axes))
    batch = learner.placeholder_batch(w.rows, w.prompt, w.new_tokens)
    if learner.cfg.grpo.packs:
        batch = batch.replace(trees=learner.pack(batch))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows), batch)


def lower_grpo_step(learner: Any, w: Workload) -> list[Any]:
    """The learner's train step on `grpo_step_batch`."""
    return [learner.lower_step(grpo_step_batch(learner, w), jnp.float32(1.0))]


def es_masters(config: Any, mesh: Mesh, optimizer_name: str = "adam") -> tuple[Any, dict[str, Any], Any, Any]:
    """ES's update state as abstract arrays on a (pop, model) mesh: the noise plan, the perturbed fp32 masters
    (`sharding.master_spec`), the optimizer and its state placed like them."""
    from jaxcore.es import eggroll
    from jaxcore.model.state import flat_state
    from jaxcore.model.transformer import abstract_model
    from jaxcore.parallel import sharding
    from jaxcore.runtime.optim import OptimizerConfig, make_optimizer

    model = abstract_model(config)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=2, rank=1))
    flat = flat_state(model)
    masters = {t.path: abstract(flat[t.path], NamedSharding(mesh, sharding.master_spec(
        t.path, tuple(flat[t.path].shape), mesh, head_dim=config.head_dim))) for t in plan.targets}
    optimizer = make_optimizer(OptimizerConfig(optimizer_name), learning_rate=1e-3)
    opt_state = jax.tree.map(abstract, jax.eval_shape(optimizer.init, masters),
                             sharding.optimizer_state_shardings(optimizer, masters, mesh))
    return plan, masters, optimizer, opt_state


def lower_es_update(config: Any, mesh: Mesh, population: int, optimizer_name: str = "adam") -> list[Any]:
    """The ES update's programs: g from regenerated factors (each device its slice of the masters), then the
    optimizer step on the sharded masters."""
    from jaxcore.es import eggroll

    plan, masters, optimizer, opt_state = es_masters(config, mesh, optimizer_name)
    plan = dataclasses.replace(plan, config=dataclasses.replace(plan.config, population=population))
    fitness = jax.ShapeDtypeStruct((population,), jnp.float32, sharding=NamedSharding(mesh, P()))
    gradient = eggroll._gradient_drawing_slices.lower(plan, jnp.int32(0), fitness, out_sharding=tuple(
        (path, x.sharding) for path, x in masters.items()))
    update = eggroll.apply_update_donating.lower(masters, opt_state, masters, optimizer)
    return [gradient, update]


# -------------------------------------------------------------------------------------------- reading them


@dataclasses.dataclass
class Compiled:
    """What the compiler made of one program (the sum over its parts)."""

    kernels: int
    collectives: dict[str, int]
    memory_bytes: int           # the largest part's arguments + outputs + temporaries - aliased, per device
    bytes_accessed: int         # what the entry's kernels read and write (`hlo.kernel_bytes`), over the parts
    seconds: float              # lowering + compiling


def compile_all(lowered: Sequence[Any]) -> Compiled:
    began = time.perf_counter()
    compiled = [one.compile() for one in lowered]
    texts = [c.as_text() for c in compiled]
    return Compiled(sum(map(hlo.kernels, texts)), hlo.summed_counts(map(hlo.collective_counts, texts)),
                    max(peak_bytes(c.memory_analysis()) for c in compiled), sum(map(hlo.kernel_bytes, texts)),
                    time.perf_counter() - began)


def per_layer(build: Callable[[int], Sequence[Any]], depths: tuple[int, int] = DEPTHS) -> tuple[float, Compiled]:
    """Kernels per transformer layer of the program `build(layers)` lowers (the difference between two depths),
    and the deeper program's figures."""
    shallow, deep = (compile_all(build(layers)) for layers in depths)
    return (deep.kernels - shallow.kernels) / (depths[1] - depths[0]), deep


def model_config(preset: str, layers: int | None = None) -> Any:
    from jaxcore.hf.tiny import preset_config
    from jaxcore.model.families import config_from_hf

    hf = preset_config(preset)
    return config_from_hf(hf if layers is None else {**hf, "num_hidden_layers": layers})


def program_builders(preset: str, devices: Sequence[Any], w: Workload) -> dict[str, Callable[[int], list[Any]]]:
    """{program: build(layers) -> its lowered parts} at `preset`'s width with `layers` layers.

    Decode and prefill on one device (kernels are per device); the GRPO step on all of `devices` as its
    data-parallel mesh (its kernels per device include the gradients' all-reduces); ES's generation and update on
    all of `devices` as a ("pop", "model") mesh with model 1, as `jaxcore es` lays them out by default, a population
    of `w.rows` members (at least a pair per device) each answering `ES_PROMPTS` prompts. Decoding takes the path a
    GPU runs (the fused attention kernel), or XLA's ops for the `REFERENCE_PROGRAMS`."""
    from jaxcore.parallel import meshes

    one = meshes.make_mesh({meshes.DATA: 1}, devices[:1])
    data = meshes.grpo_mesh(1, devices)
    es = meshes.es_mesh(1, devices)

    def plain(layers: int, path: str = "pallas") -> Any:
        return placed_model(model_config(preset, layers), one, w.dtype).use_decode_attention(path)

    def population(layers: int, path: str = "pallas") -> Any:
        return placed_population(plain(layers), one, w.rows, None)[0].use_decode_attention(path)

    members = max(w.rows, 2 * len(devices))                             # at least a pair per device

    def es_population(layers: int) -> Any:
        model = placed_model(model_config(preset, layers), es, w.dtype, meshes.MODEL)
        return placed_population(model, es, members, meshes.POP)[0].use_decode_attention("pallas")

    es_rows = dataclasses.replace(w, rows=members * ES_PROMPTS)        # every member answers ES_PROMPTS prompts
    # the step's positions (prompt + completion - 1) a multiple of 16: at 8 rows x 47 positions a device, XLA's
    # default GEMM tiling for the A100 finds no tile for a dot of its backward and fails to compile
    grpo_rows = dataclasses.replace(w, prompt=w.prompt + 1)
    return {
        "decode": lambda layers: lower_decode(plain(layers), one, w),
        "decode_population": lambda layers: lower_decode(population(layers), one, w),
        "decode_xla": lambda layers: lower_decode(plain(layers, "xla"), one, w),
        "decode_population_xla": lambda layers: lower_decode(population(layers, "xla"), one, w),
        "prefill": lambda layers: lower_prefill(plain(layers), one, w),
        "grpo_step": lambda layers: lower_grpo_step(grpo_learner(model_config(preset, layers), data, w.dtype),
                                                    grpo_rows),
        "es_generate": lambda layers: lower_generate(es_population(layers), es, es_rows, meshes.POP),
        "es_update": lambda layers: lower_es_update(model_config(preset, layers), es, members),
    }


def decode_roofline(preset: str, w: Workload, target: str, population: bool, measured_bytes: float
                    ) -> dict[str, Any]:
    """The decode step's bytes (what its compiled kernels read and write) against the roofline's need at the full
    depth, and the time the target's HBM needs to move them."""
    from jaxcore.bench import gpu_targets, roofline
    from jaxcore.hf.tiny import preset_config

    shape = roofline.Shape.from_hf(preset_config(preset))
    targets = ([(i, o) for _ in range(shape.layers) for i, o in shape.layer_matrices()] if population else [])
    need = roofline.decode_step(shape, w.rows, w.prompt + w.new_tokens, jnp.dtype(w.dtype).itemsize,
                                factor_targets=targets, rank=1)
    return {"need_bytes": need["bytes"], "xla_bytes": measured_bytes,
            "xla_over_need": round(measured_bytes / need["bytes"], 3),
            "hbm_limit_us": round(need["bytes"] / gpu_targets.hbm_bandwidth(target) * 1e6, 2)}


def run(options: Any) -> dict[str, Any]:
    from jaxcore.bench import device_info, gpu_targets

    target, count = options.target, options.devices
    devices = gpu_targets.topology_devices(target, count)
    w = Workload(rows=8 if options.quick else 64, dtype="bfloat16")
    preset = "tiny" if options.quick else options.preset
    results: dict[str, Any] = {"gpu_compile.settings": {"target": target, "devices": count, "preset": preset,
                                                        **dataclasses.asdict(w), "depths": DEPTHS}}
    for name, build in program_builders(preset, devices, w).items():
        print(f"gpu-compile: {name} for {count} x {target}", flush=True)
        kernels, deep = per_layer(build)
        results[f"gpu_compile.{name}"] = {"kernels_per_layer": kernels, "kernels": deep.kernels,
                                          "collectives": deep.collectives, "memory_bytes": deep.memory_bytes,
                                          "compile_s": round(deep.seconds, 2)}
        if name.startswith("decode"):
            full = compile_all(build(model_config(preset).num_layers))
            results[f"gpu_compile.{name}"]["roofline"] = decode_roofline(
                preset, w, target, name.startswith("decode_population"), full.bytes_accessed)
    results["gpu_compile.device"] = device_info()
    return results
