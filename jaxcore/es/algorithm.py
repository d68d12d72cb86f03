"""The EGGROLL trainer on the shared runtime (`jaxcore es`).

Every epoch all N members answer the same P prompts G times: rows are laid out member-major
(member i owns rows [i*P*G, (i+1)*P*G), prompt-major inside). The mesh is ("pop", "model"): rows are
sharded over "pop", compute weights (and their members' factors) tensor-parallel over "model", and
each process scores only the rows it holds. Per-member fitness (N floats) is all-gathered and
shaped; the master weights and optimizer state are sharded over all devices, so each device
updates only its slice of them, and the compute weights are re-assembled for the next epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import numpy as np

from jaxcore.es import eggroll
from jaxcore.es.config import ESConfig
from jaxcore.es.memory import plan_job
from jaxcore.model.families import config_from_hf
from jaxcore.model.state import flat_state, module_copy, write_params
from jaxcore.parallel import meshes, sharding
from jaxcore.parallel.config import SHARD_MIN_SIZE
from jaxcore.rewards import Example, Scorer
from jaxcore.runtime.algorithm import Algorithm, StepResult
from jaxcore.runtime.completions import CompletionLog
from jaxcore.runtime.memory import MemoryPlan, largest_population
from jaxcore.runtime.optim import make_optimizer
from jaxcore.runtime.plan_check import hf_config_at
from jaxcore.runtime.programs import PhaseClock
from jaxcore.runtime.rollout import Rollout, function_means

log = logging.getLogger(__name__)


def member_fitness(rewards_NPG: np.ndarray, shaping: str) -> np.ndarray:
    """Fitness per member before shaping; `group_zscore` shapes per prompt across members first."""
    per_prompt_NP = rewards_NPG.mean(-1)
    if shaping == "group_zscore":
        n, p = per_prompt_NP.shape
        shaped_PN = np.asarray(eggroll.shape_fitness(per_prompt_NP.T.reshape(-1), "group_zscore", group_size=n))
        return shaped_PN.reshape(p, n).mean(0)
    return per_prompt_NP.mean(-1)


def shard_masters(model: Any, mesh: jax.sharding.Mesh, dtype: str = "float32", min_size: int = SHARD_MIN_SIZE) -> None:
    """Master weights sharded over every device of `mesh` (`sharding.master_spec`, in `dtype`), in place:
    each device then updates only its slice, and the optimizer state (initialised from them) follows.
    Leaves already in place (loaded straight into the masters' layout) are left alone, not copied."""
    target = sharding.master_shardings(mesh, min_size, model.config.head_dim)
    flat = flat_state(model)
    moved = {path: value for path, value in flat.items()
             if not (isinstance(value, jax.Array) and value.dtype == jax.numpy.dtype(dtype)
                     and value.sharding.is_equivalent_to(target(path, tuple(value.shape)), value.ndim))}
    if moved:
        write_params(model, sharding.shard_params(
            moved, lambda path, shape: target(path, shape).spec, mesh, dtype=dtype))


def init_opt_state(optimizer: Any, params: dict[str, jax.Array], mesh: jax.sharding.Mesh) -> Any:
    """The optimizer state sharded like the masters it mirrors (step counters replicated)."""
    return jax.jit(optimizer.init, out_shardings=sharding.optimizer_state_shardings(optimizer, params, mesh))(params)


def compute_model(model: Any, mesh: jax.sharding.Mesh) -> Any:
    """A copy of `model` whose weights are in its compute dtype, tensor-parallel over the mesh's
    "model" axis (replicated over "pop"): re-assembled from the sharded masters once per epoch."""
    size = mesh.shape[meshes.MODEL]
    flat = sharding.shard_params(flat_state(model), lambda path, shape: sharding.tensor_parallel_spec(
        path, shape, meshes.MODEL, size, model.config.head_dim), mesh, dtype=model.dtype)
    copy = module_copy(model)
    write_params(copy, flat)
    return copy


def _head_dim(model_path: str) -> int | None:
    """The attention head width of the model at `model_path` (None when it cannot be read: loading says why), so
    the masters load straight into the head-aligned tensor-parallel layout."""
    try:
        hf = hf_config_at(model_path)
        return config_from_hf(hf).head_dim if hf else None
    except (ValueError, OSError):
        return None


class EggrollAlgorithm(Algorithm):
    """EGGROLL on a jaxcore model: population rollouts, scoring, shaped fitness, optax update."""

    name = "es"

    @classmethod
    def load_targets(cls, cfg: ESConfig) -> dict[str, Any]:
        """Masters sharded over the whole (pop, model) mesh in `es.master_dtype` (empty when the mesh cannot be
        built: the constructor then says why)."""
        try:
            mesh = meshes.es_mesh(cfg.mesh.model)
        except ValueError:
            return {}
        return {"shardings": sharding.master_shardings(mesh, cfg.mesh.shard_min_size, _head_dim(cfg.model.path)),
                "param_dtype": cfg.es.master_dtype}

    @classmethod
    def mesh_divisor(cls, cfg: ESConfig) -> tuple[str, int]:
        return "mesh.model", cfg.mesh.model

    @classmethod
    def memory_plan(cls, cfg: ESConfig, model_cfg: Any, **kw: Any) -> MemoryPlan:
        return plan_job(cfg, model_cfg, **kw)

    @classmethod
    def device_memory(cls, cfg: ESConfig) -> str:
        return cfg.mesh.device_memory

    @classmethod
    def largest_fitting(cls, cfg: ESConfig, model_cfg: Any, *, devices: int, **kw: Any) -> tuple[str, int]:
        """The largest population (pairs over the pop devices) that fits."""
        best = largest_population(lambda n: cls.memory_plan(cfg, model_cfg, population=n, devices=devices, **kw).fits,
                                  cfg.es.population, devices // cfg.mesh.model)
        return "population", best

    @classmethod
    def layout_refusal(cls, cfg: ESConfig, devices: int) -> str | None:
        pop_devices = devices // cfg.mesh.model
        if cfg.es.population % pop_devices:
            return f"es.population={cfg.es.population} must be a multiple of the {pop_devices} devices of the pop axis"
        return None

    def __init__(self, model: Any, tokenizer: Any, cfg: ESConfig, *, eos_token_ids: tuple[int, ...] = (),
                 rollout: Rollout | None = None):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.eos_token_ids = eos_token_ids
        # the run's rollout (with tools / environments: episodes); default: single-turn from the config
        self.rollout = rollout or Rollout(cfg.rollout, tokenizer, eos_token_ids=eos_token_ids, seed=cfg.train.seed)
        es = cfg.es
        self.plan = eggroll.make_plan(model, dataclasses.replace(es, seed=cfg.train.seed if es.seed is None
                                                                 else es.seed))
        self.mesh = meshes.es_mesh(cfg.mesh.model)
        pop_devices = self.mesh.shape[meshes.POP]
        reason = self.layout_refusal(cfg, self.mesh.size)
        if reason:
            raise ValueError(reason)
        if (es.population // pop_devices) % 2:
            log.warning("population/devices is odd: antithetic pairs straddle devices (slower)")
        min_size = cfg.mesh.shard_min_size
        if min_size < 1:
            raise ValueError(f"mesh.shard_min_size={min_size} must be >= 1")
        shard_masters(model, self.mesh, es.master_dtype, min_size)
        self.rows = meshes.leading_axis(self.mesh, meshes.POP)
        self.eval_sharding = self.rows          # evaluation: rows over "pop", weights over "model" (eval_model)
        self.optimizer = make_optimizer(cfg.optimizer, total_steps=cfg.train.epochs)
        self.opt_state = init_opt_state(self.optimizer, eggroll.perturbed_params(model, self.plan), self.mesh)

    def eval_model(self) -> Any:
        """The model evaluation runs: compute-dtype weights tensor-parallel over "model" (never the
        FSDP masters, which a forward pass would gather whole onto every device)."""
        return compute_model(self.model, self.mesh)

    # -- checkpointing -------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        return {"params": flat_state(self.model), "opt_state": self.opt_state}

    def restore_state(self, state: dict[str, Any]) -> None:
        write_params(self.model, state["params"])
        self.opt_state = state["opt_state"]

    # -- one epoch -------------------------------------------------------------------------------

    def train_step(self, epoch: int, examples: list[Example], scorer: Scorer) -> StepResult:
        es = self.cfg.es
        n, p, g = es.population, len(examples), self.cfg.rollout.generations_per_prompt
        clock, began = PhaseClock(), time.perf_counter()
        with clock.phase("rollout"):     # rows member-major: every member rolls out every prompt g times
            population = eggroll.population(compute_model(self.model, self.mesh), self.plan, epoch,
                                            out_sharding=self.rows)
            out = self.rollout.run(population, examples, key=self.rollout.epoch_key(epoch), generations=g,
                                   members=n, row_sharding=self.rows, logprobs=False)
        with clock.phase("scoring"):
            scores = self.rollout.score(out, scorer)
            rewards = scores.rewards_B.reshape(n, p, g)
            fitness_N = member_fitness(rewards, es.shaping)
        failed = scores.every_call_failed()
        if failed is not None:              # nothing to learn from: a bad step, not an update on fallbacks
            return StepResult({**{f"rewards/{k}/failures": v for k, v in scores.failures.items()},
                               **clock.metrics()}, skipped=True, reason=failed)
        metrics: dict[str, Any] = {
            **scores.metrics,                                   # the reward functions' log_metric values (TRL's)
            "reward": float(rewards.mean()), "reward_std": float(rewards.std()), "reward_max": float(rewards.max()),
            "fitness_std": float(fitness_N.std()), "completions/mean_length": float(np.mean(scores.lengths_B)),
            "num_tokens": int(scores.lengths_B.sum()),
            "prompts/truncated": out.prompts_truncated,
            **{f"rewards/{k}/mean": v for k, v in function_means(scores.per_function).items()},
            **{f"rewards/{k}/failures": v for k, v in scores.failures.items()},
            **out.metrics,
        }
        if not np.isfinite(fitness_N).all():
            return StepResult({**metrics, **clock.metrics()}, skipped=True, reason="non-finite fitness")
        shaping = "none" if es.shaping == "group_zscore" else es.shaping    # group shaping already applied
        with clock.phase("update"):
            self.opt_state, update = eggroll.es_step(self.model, self.plan, self.optimizer, self.opt_state, epoch,
                                                     fitness_N, shaping, donate_params=True)
        metrics.update(clock.metrics(), grad_norm=update["grad_norm"], step_time=time.perf_counter() - began)
        completions = None
        if self.cfg.train.log_completions:          # every member's rows (member-major); ES has no advantage per row
            completions = CompletionLog.of_rollout(self.tokenizer, out.result, out.row_examples, scores.per_function,
                                                   None, out.messages, scores.columns)
        return StepResult(metrics, skipped=update["skipped"], reason="non-finite update" if update["skipped"] else "",
                          completions=completions)
