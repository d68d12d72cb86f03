"""EGGROLL: low-rank evolution strategies (arXiv:2511.16652), exactly as docs/design.md states it.

For a weight matrix W [I, O], member i and epoch e (rank r, scale sigma, antithetic pairs)::

    AB = normal(fold_in(fold_in(key_W, e // noise_reuse), i // 2), (I + O, r));  A, B = AB[:I], AB[I:]
    sign = +1 for even i, -1 for odd i
    member i uses W + sigma * eps_i,  eps_i = sign * A @ B.T / sqrt(r)     (never materialised)
    g_W = (1/N) * sum_i f_i * eps_i                                        (one einsum over pairs)

and the optax optimiser receives -g. `eps_i` has unit variance per entry and carries no sigma, so
E[g] = sigma * grad F for small sigma and an SGD learning rate is Qiu et al.'s alpha
(`theta += alpha * (1/N) * sum_i z_i eps_i`), independent of sigma.

`key_W` comes from the run seed once per parameter: split per leaf kind (e.g. "attn.q.kernel"),
then per layer. Norm scales and biases are frozen by default or get full-rank noise
`sigma * sign * eps` (g uses `sign * eps`); embeddings and the LM head are frozen by default.
Every factor is regenerated from (seed, epoch, member) alone, on any device.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxcore.es.config import EggrollConfig  # noqa: F401  (re-exported: `eggroll.EggrollConfig`)
from jaxcore.es.population import MemberNoise, perturbed_model
from jaxcore.es.shaping import shape_fitness
from jaxcore.model.parameters import is_embedding, is_lm_head, is_token_table
from jaxcore.model.state import flat_state, variable_at, write_params
from jaxcore.model.transformer import Transformer
from jaxcore.parallel.sharding import factor_specs
from jaxcore.runtime.optim import all_finite

Array = jax.Array
log = logging.getLogger(__name__)
_LAYER = re.compile(r"^blocks\.(\d+)\.(.+)$")


@dataclasses.dataclass(frozen=True)
class NoiseTarget:
    """One perturbed parameter: its path, shape, and whether its noise is low-rank."""

    path: str
    shape: tuple[int, ...]
    low_rank: bool


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NoisePlan:
    """Which parameters are perturbed and their per-parameter keys (derived once from the seed)."""

    keys: dict[str, Array]
    targets: tuple[NoiseTarget, ...] = dataclasses.field(metadata=dict(static=True))
    config: EggrollConfig = dataclasses.field(metadata=dict(static=True))


def select_targets(shapes: dict[str, tuple[int, ...]], cfg: EggrollConfig) -> tuple[NoiseTarget, ...]:
    """The perturbed parameters of a model with these parameter shapes, in sorted path order. With
    `include_lm_head` on a model whose head is tied to its embedding, the shared table is the head."""
    targets = []
    tied_head = (cfg.include_lm_head and not any(map(is_lm_head, shapes))
                 and any(map(is_token_table, shapes)))
    if tied_head:
        log.warning("es.include_lm_head on a model with tied embeddings: perturbing embed.table, which is both "
                    "the input embedding and the LM head")
    for path in sorted(shapes):
        shape = shapes[path]
        if is_embedding(path) and not (cfg.include_embeddings or (tied_head and is_token_table(path))):
            continue
        if is_lm_head(path) and not cfg.include_lm_head:
            continue
        if len(shape) == 2:
            targets.append(NoiseTarget(path, shape, True))
        elif cfg.non_matrix == "full":
            targets.append(NoiseTarget(path, shape, False))
    return tuple(targets)


def _kind_and_layer(path: str) -> tuple[str, int]:
    match = _LAYER.match(path)
    return (match.group(2), int(match.group(1))) if match else (path, 0)


def parameter_keys(paths: list[str], seed: int) -> dict[str, Array]:
    """key_W for every path: the seed's key split per leaf kind, then per layer."""
    kinds: dict[str, int] = {}
    for path in paths:
        kind, layer = _kind_and_layer(path)
        kinds[kind] = max(kinds.get(kind, 0), layer + 1)
    kind_keys = dict(zip(sorted(kinds), jax.random.split(jax.random.key(seed), len(kinds))))
    layer_keys = {kind: jax.random.split(kind_keys[kind], count) for kind, count in kinds.items()}
    return {path: layer_keys[kind][layer] for path in paths for kind, layer in [_kind_and_layer(path)]}


def make_plan(model: Transformer, cfg: EggrollConfig) -> NoisePlan:
    """The noise plan for `model` (keys for every parameter kind/layer, so options never shift them)."""
    cfg = dataclasses.replace(cfg, seed=cfg.seed or 0)        # a copy: later edits of `cfg` never reach the plan
    shapes = {path: tuple(value.shape) for path, value in flat_state(model).items()}
    keys = parameter_keys(sorted(shapes), cfg.seed)
    targets = select_targets(shapes, cfg)
    return NoisePlan({t.path: keys[t.path] for t in targets}, targets, cfg)


def _pair_key(key_W: Array, epoch: Array, pair: Array, noise_reuse: int) -> Array:
    return jax.random.fold_in(jax.random.fold_in(key_W, epoch // noise_reuse), pair)


def _target_groups(plan: NoisePlan) -> tuple[tuple[NoiseTarget, ...], ...]:
    """The targets grouped by kind and shape (the same matrix in every layer), in plan order."""
    groups: dict[tuple[str, tuple[int, ...]], list[NoiseTarget]] = {}
    for target in plan.targets:
        groups.setdefault((_kind_and_layer(target.path)[0], target.shape), []).append(target)
    return tuple(tuple(targets) for targets in groups.values())


def _drawn_groups(plan: NoisePlan, epoch: Array, pairs: Array) -> list[Array]:
    """Unscaled noise per `_target_groups` group, each drawn by one vmapped RNG call over its stacked keys
    rather than one call per target (compile time grows with the number of calls): [L, P, I+O, r] for
    low-rank targets, [L, P, ...] for dense ones. The same numbers as a draw per target."""
    cfg = plan.config
    drawn = []
    for targets in _target_groups(plan):
        t = targets[0]
        shape = (sum(t.shape), cfg.rank) if t.low_rank else t.shape

        def draw(key: Array, p: Array, shape: tuple[int, ...] = shape) -> Array:
            return jax.random.normal(_pair_key(key, epoch, p, cfg.noise_reuse), shape, jnp.float32)

        keys_L = jnp.stack([plan.keys[t.path] for t in targets])
        drawn.append(jax.vmap(lambda key: jax.vmap(lambda p: draw(key, p))(pairs))(keys_L))
    return drawn


def pair_factors(plan: NoisePlan, epoch: Array, pairs: Array) -> dict[str, Array]:
    """Unscaled noise for the given antithetic pairs: low-rank AB [P, I+O, r], dense eps [P, ...]."""
    return {t.path: drawn_L[i] for targets, drawn_L in zip(_target_groups(plan), _drawn_groups(plan, epoch, pairs))
            for i, t in enumerate(targets)}


@functools.partial(jax.jit, static_argnames=("dtype", "out_sharding"))
def _group_noise(plan: NoisePlan, epoch: Array, dtype: Any, out_sharding: Any) -> list[Array]:
    """Each group's noise, scaled and cast: low-rank groups as a [L, P, I, r] and a [L, P, O, r] (sigma/sqrt(r)
    folded into b), dense groups as [L, P, ...] (sigma folded in), in `_drawn_groups` order. With a row
    sharding of the pairs, each device draws only its own pairs."""
    cfg = plan.config
    out = []
    for targets, drawn_L in zip(_target_groups(plan), _drawn_groups(plan, epoch, jnp.arange(cfg.population // 2))):
        if targets[0].low_rank:
            rows = targets[0].shape[0]
            out += [drawn_L[:, :, :rows].astype(dtype),
                    (drawn_L[:, :, rows:] * (cfg.sigma / math.sqrt(cfg.rank))).astype(dtype)]
        else:
            out.append((drawn_L * cfg.sigma).astype(dtype))
    if isinstance(out_sharding, NamedSharding):
        behind_layers = NamedSharding(out_sharding.mesh, PartitionSpec(None, *out_sharding.spec))
        out = [jax.lax.with_sharding_constraint(x, behind_layers) for x in out]
    return out


@functools.partial(jax.jit, static_argnames=("target_groups", "out_sharding"))
def _layer_noise(groups: list[Array], target_groups: tuple[tuple[NoiseTarget, ...], ...],
                 out_sharding: Any) -> MemberNoise:
    """`_group_noise`'s arrays cut into one array per target."""
    low_rank, dense, arrays = {}, {}, iter(groups)
    for targets in target_groups:
        if targets[0].low_rank:
            a_LPIR, b_LPOR = next(arrays), next(arrays)
            low_rank.update({t.path: (a_LPIR[i], b_LPOR[i]) for i, t in enumerate(targets)})
        else:
            delta_L = next(arrays)
            dense.update({t.path: delta_L[i] for i, t in enumerate(targets)})
    noise = MemberNoise(low_rank, dense)
    if out_sharding is not None:
        noise = jax.lax.with_sharding_constraint(noise, out_sharding)
    return noise


def member_noise(plan: NoisePlan, epoch: Array, out_sharding: Any = None, dtype: Any = jnp.float32) -> MemberNoise:
    """The population's perturbations for `epoch`, one set per antithetic pair (made once per epoch).

    `dtype` is the compute dtype the factors are stored in (bf16 halves their memory on GPU). Two programs:
    the draw, scaled and cast per group of layers, then the cut into layers. In one program XLA fused the
    normal's inverse-erf polynomial into every layer's slice, one copy per output, and compiled several times
    longer.
    """
    return _layer_noise(_group_noise(plan, epoch, dtype, out_sharding), _target_groups(plan), out_sharding)


def population(model: Transformer, plan: NoisePlan, epoch: int | Array, out_sharding: Any = None) -> Transformer:
    """The population for `epoch` as a model whose rows are grouped by member (N = plan.config.population).

    With a row sharding `out_sharding` and weights sharded over a model axis, each factor is placed
    consistently with its weight (a with W's input dim, b with its output dim).
    """
    noise = member_noise(plan, jnp.asarray(epoch, jnp.int32), out_sharding=out_sharding, dtype=model.dtype)
    if isinstance(out_sharding, NamedSharding):
        noise = _place_factors(model, noise, out_sharding)
    return perturbed_model(model, noise)


def _place_factors(model: Transformer, noise: MemberNoise, rows: NamedSharding) -> MemberNoise:
    """Reshard the factors of every model-sharded weight to match it (no-op for replicated weights)."""
    row_axis = rows.spec[0] if len(rows.spec) else None
    low_rank = dict(noise.low_rank)
    for path, (a_PIR, b_POR) in noise.low_rank.items():
        w_sharding = variable_at(model, path).get_value().sharding
        if isinstance(w_sharding, NamedSharding) and any(w_sharding.spec):
            a_spec, b_spec = factor_specs(w_sharding.spec, row_axis)
            low_rank[path] = (jax.device_put(a_PIR, NamedSharding(rows.mesh, a_spec)),
                              jax.device_put(b_POR, NamedSharding(rows.mesh, b_spec)))
    return MemberNoise(low_rank, noise.dense)


# ----------------------------------------------------------------------------- the update


def _pair_gradients(target_groups: tuple[tuple[NoiseTarget, ...], ...], drawn: list[Array], fitness_N: Array,
                    cfg: EggrollConfig) -> dict[str, Array]:
    """g for every target from its group's unscaled draws (`_drawn_groups`): one einsum over the pairs each."""
    n = cfg.population
    diff_P = fitness_N[0::2] - fitness_N[1::2]              # f_{2p} * (+1) + f_{2p+1} * (-1)
    coeff_P = diff_P / (math.sqrt(cfg.rank) * n)
    grads = {}
    for targets, drawn_L in zip(target_groups, drawn):
        for i, target in enumerate(targets):
            if target.low_rank:
                ab_PKR = drawn_L[i]
                a_PIR, b_POR = ab_PKR[:, :target.shape[0]], ab_PKR[:, target.shape[0]:]
                grads[target.path] = jnp.einsum("p,pir,por->io", coeff_P, a_PIR, b_POR)
            else:
                grads[target.path] = jnp.tensordot(diff_P / n, drawn_L[i], axes=1)
    return grads


def _constrained(grads: dict[str, Array], out_sharding: tuple[tuple[str, Any], ...] | None) -> dict[str, Array]:
    for path, target_sharding in out_sharding or ():
        grads[path] = jax.lax.with_sharding_constraint(grads[path], target_sharding)
    return grads


@functools.partial(jax.jit, static_argnames="out_sharding")
def _regenerated_draws(plan: NoisePlan, epoch: Array, out_sharding: Any) -> list[Array]:
    """The gradient's unscaled draws (`_drawn_groups`), as one program, placed by `out_sharding`."""
    drawn = _drawn_groups(plan, epoch, jnp.arange(plan.config.population // 2))
    return drawn if out_sharding is None else jax.lax.with_sharding_constraint(drawn, out_sharding)


@functools.partial(jax.jit, static_argnames=("target_groups", "cfg", "out_sharding"))
def _gradient_from_draws(drawn: list[Array], fitness_N: Array, target_groups: tuple[tuple[NoiseTarget, ...], ...],
                         cfg: EggrollConfig, out_sharding: tuple[tuple[str, Any], ...] | None) -> dict[str, Array]:
    return _constrained(_pair_gradients(target_groups, drawn, fitness_N, cfg), out_sharding)


@functools.partial(jax.jit, static_argnames=("out_sharding",))
def _gradient_drawing_slices(plan: NoisePlan, epoch: Array, fitness_N: Array,
                             out_sharding: tuple[tuple[str, Any], ...]) -> dict[str, Array]:
    drawn = _drawn_groups(plan, epoch, jnp.arange(plan.config.population // 2))
    return _constrained(_pair_gradients(_target_groups(plan), drawn, fitness_N, plan.config), out_sharding)


def estimate_gradient(plan: NoisePlan, epoch: Array, fitness_N: Array,
                      out_sharding: tuple[tuple[str, Any], ...] | None = None) -> dict[str, Array]:
    """g = (1/N) sum_i f_i eps_i for every perturbed parameter (unit-variance eps, no sigma in it),
    from regenerated factors: one einsum over the pairs.

    `out_sharding` ((path, sharding) pairs, e.g. the sharded masters'): each device computes only
    its slice of g (the factors are regenerated from the keys on every device; they are small).
    Where no master is split, two programs, the draw (on every device of the masters' mesh) and the
    products: in one program XLA fused the normal's inverse-erf polynomial into every layer's product (slower to
    compile and to run). Split masters
    keep the one program, in which XLA draws on each device only the slice its part of g needs.
    """
    epoch = jnp.asarray(epoch, jnp.int32)
    shardings = [sharding for _, sharding in out_sharding or ()]
    if any(any(sharding.spec) for sharding in shardings):
        return _gradient_drawing_slices(plan, epoch, fitness_N, out_sharding)
    everywhere = NamedSharding(shardings[0].mesh, PartitionSpec()) if shardings else None
    drawn = _regenerated_draws(plan, epoch, everywhere)
    return _gradient_from_draws(drawn, fitness_N, _target_groups(plan), plan.config, out_sharding)


def perturbed_params(model: Transformer, plan: NoisePlan) -> dict[str, Array]:
    """The parameters ES updates (the optimizer state covers only these)."""
    flat = flat_state(model)
    return {t.path: flat[t.path] for t in plan.targets}


def _apply_update(params: dict[str, Array], opt_state: Any, grads: dict[str, Array],
                  optimizer: optax.GradientTransformation) -> tuple[dict[str, Array], Any, Array]:
    """params <- params + optimizer(-g): ES ascends the fitness. Returns (params, state, applied): when the new
    parameters are not all finite (a non-finite update makes them so, e.g. a NaN learning rate), the old params
    and state come back and `applied` is False.

    Two passes over the weights: the check computes p + u without keeping it, then p + (u if applied else -0.0)
    (adding -0.0 leaves every value as it was, signed zeros included). Keeping p + u for a select afterwards, and
    checking u on its own (p + u is finite only if u is), made XLA pass over them 9 times for SGD, not 5.5."""
    negated = jax.tree.map(jnp.negative, grads)
    updates, new_state = optimizer.update(negated, opt_state, params)
    # optax promotes bf16 moments to the fp32 gradient's dtype; keep the state's own (es.master_dtype)
    new_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, opt_state)
    applied = all_finite(jax.tree.map(lambda p, u: p + u, params, updates))
    new_params = jax.tree.map(lambda p, u: (p + jnp.where(applied, u, -0.0)).astype(p.dtype), params, updates)
    return new_params, jax.tree.map(lambda new, old: jnp.where(applied, new, old), new_state, opt_state), applied


# The optimizer state is always donated (the caller passes it in and gets the new one back). The
# parameters are donated only on request: a caller may still hold them through `perturbed_params`
# or an earlier population. Keeping them costs one extra copy of the perturbed parameters (fp32)
# while the update runs (measured: 100 MB on the 34M bench model); the trainer, which holds no
# such references, donates them.
apply_update = jax.jit(_apply_update, static_argnames=("optimizer",), donate_argnames=("opt_state",))
apply_update_donating = jax.jit(_apply_update, static_argnames=("optimizer",), donate_argnames=("params", "opt_state"))


# Under jit: the eager form adds a sharded square to an unsharded zero imaginary part, and JAX 0.10's
# eager dispatch then maps the result onto the mesh of an earlier call with the same devices, which fails
# once two mesh shapes have been used in one process (tests/parallel/test_mesh.py has the case).
global_norm = jax.jit(optax.tree.norm)


def es_step(model: Transformer, plan: NoisePlan, optimizer: optax.GradientTransformation, opt_state: Any,
            epoch: int, fitness_N: Any, shaping: str = "zscore", group_size: int | None = None, *,
            donate_params: bool = False) -> tuple[Any, dict[str, Any]]:
    """Shape the (gathered) fitness, estimate g from regenerated factors, and update `model` in place.

    Returns the new optimizer state (the one passed in is consumed: its buffers are donated).
    Arrays taken from the model before the step (`perturbed_params`, a population) remain valid
    and keep the old values, unless `donate_params` (saves one copy of the perturbed parameters;
    only for callers that hold no such arrays, like the trainer). A non-finite gradient, update or
    new parameter value is not applied: the returned metrics say `skipped`.
    """
    shaped_N = shape_fitness(fitness_N, shaping, group_size)
    params = perturbed_params(model, plan)
    shardings = tuple((k, v.sharding) for k, v in params.items() if isinstance(v.sharding, NamedSharding))
    grads = estimate_gradient(plan, jnp.asarray(epoch, jnp.int32), shaped_N, out_sharding=shardings or None)
    grad_norm = float(global_norm(grads))
    if not math.isfinite(grad_norm):
        return opt_state, {"grad_norm": grad_norm, "skipped": True}
    update = apply_update_donating if donate_params else apply_update
    params, opt_state, applied = update(params, opt_state, grads, optimizer)
    write_params(model, params)            # the old values when not applied (the inputs were donated)
    return opt_state, {"grad_norm": grad_norm, "skipped": not bool(applied)}
