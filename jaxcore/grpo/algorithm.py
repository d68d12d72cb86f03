"""The GRPO trainer on the shared runtime (`jaxcore grpo`).

Every epoch the runner hands over P prompts; the policy samples G completions per prompt
(`jaxcore.runtime.rollout`: rows prompt-major, sharded over the batch axes of the mesh), each process scores
the rows it holds, rewards are gathered, turned into group advantages, and `GRPOLearner` takes
`num_iterations` optimiser steps on the rollout. Logged metrics use TRL's names.

Old log-probs (the ratio's denominator) follow TRL (`GRPOConfig.old_logp_source`): with mu = 1 none are
stored (ratio = 1 exactly, TRL's detached-logp shortcut); with mu > 1 they are the rollout's own log-probs
when the rollout temperature is 1 (generate reports log p under the unscaled logits, which is what the loss
uses), else the learner's temperature-scaled forward at rollout time.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any

import numpy as np

from jaxcore.grpo.advantages import compute_advantages, normalized_sum_advantages, reward_metrics
from jaxcore.grpo.buckets import completion_buckets, completion_width, likely_first, prompt_width
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.learner import GRPOLearner, finite
from jaxcore.grpo.memory import plan_job
from jaxcore.grpo.step import GRPOBatch, TrainState, build_batch, rollout_metrics
from jaxcore.hf.model_checkpoint import load_any
from jaxcore.inference.generate import GenerationResult
from jaxcore.parallel import meshes, rows, sharding
from jaxcore.rewards import Example, Scorer, ScoreResult
from jaxcore.runtime.algorithm import Algorithm, StepResult
from jaxcore.runtime.completions import CompletionLog
from jaxcore.runtime.memory import MemoryPlan, largest_multiple
from jaxcore.runtime.programs import AheadOfTime, PhaseClock, spare_host_cores
from jaxcore.runtime.rollout import Rollout, RolloutOutput, RowScores

log = logging.getLogger(__name__)

STEP_METRICS = ("loss", "grad_norm", "entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean",
                "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max", "cispo_clip_ratio",
                "vespo/phi_seq_mean", "policy_loss", "entropy_coef", "ratio")


def advantage_rewards(scores: ScoreResult, fallback: float | None) -> np.ndarray:
    """The combined reward per completion, NaN where no function scored it (as in TRL: such a completion
    is left out of its group's mean/std and gets advantage 0). Samples that got the fallback count as
    scored; in a batch with fallbacks, rows that every function returned None for cannot be told apart
    from failed ones and keep the runtime's combined reward."""
    rewards_B = np.asarray(scores.rewards_B, np.float32)
    all_none_B = np.all([np.isnan(v) for v in scores.per_function.values()], axis=0)
    if fallback is None or not any(scores.failures.values()):
        rewards_B = np.where(all_none_B, np.nan, rewards_B)
    return rewards_B


def mean_step_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """The mu optimiser steps' metrics averaged (learning rate: the last step's)."""
    out = {k: float(np.mean([s[k] for s in steps])) for k in STEP_METRICS if k in steps[0]}
    out["learning_rate"] = steps[-1]["learning_rate"]
    return out


class GRPOAlgorithm(Algorithm):
    """GRPO on a jaxcore model: grouped rollouts, scoring, advantages, clipped policy-gradient steps."""

    name = "grpo"
    syncs_in_background = False      # whether a thread reads the params while the next steps run (`GRPOLearner`)

    @classmethod
    def load_targets(cls, cfg: GRPOConfig) -> dict[str, Any]:
        """With grpo.fsdp > 1, parameters FSDP-sharded over the GRPO mesh as the learner keeps them; empty
        (loaded to the default device, replicated by the learner) otherwise, or when the mesh cannot be
        built (the constructor then says why)."""
        if cfg.grpo.fsdp <= 1:
            return {}
        try:
            mesh = meshes.grpo_mesh(cfg.grpo.fsdp, cls.training_devices_of(cfg))
        except ValueError:
            return {}
        return {"shardings": sharding.fsdp_sharding_fn(mesh)}

    @classmethod
    def training_devices_of(cls, cfg: GRPOConfig) -> list[Any] | None:
        """The devices a job trains on (None: all of them), known from its config alone (where the model loads)."""
        return None

    @classmethod
    def mesh_divisor(cls, cfg: GRPOConfig) -> tuple[str, int]:
        return "grpo.fsdp", cfg.grpo.fsdp

    @classmethod
    def memory_plan(cls, cfg: GRPOConfig, model_cfg: Any, **kw: Any) -> MemoryPlan:
        return plan_job(cfg, model_cfg, **kw)

    @classmethod
    def largest_fitting(cls, cfg: GRPOConfig, model_cfg: Any, *, devices: int, **kw: Any) -> tuple[str, int]:
        """The largest rollout.prompts_per_epoch that fits (its P x G rows split over devices x micro-batches)."""
        split = devices * cfg.grpo.generation_steps
        step = split // math.gcd(split, cfg.rollout.generations_per_prompt)
        best = largest_multiple(lambda p: cls.memory_plan(cfg, model_cfg, prompts=p, devices=devices, **kw).fits,
                                cfg.rollout.prompts_per_epoch, step)
        return "rollout.prompts_per_epoch", best

    @classmethod
    def layout_refusal(cls, cfg: GRPOConfig, devices: int) -> str | None:
        n_rows = cfg.rollout.prompts_per_epoch * cfg.rollout.generations_per_prompt
        micro_batches = cfg.grpo.generation_steps
        if n_rows % (devices * micro_batches):
            return (f"prompts_per_epoch x generations_per_prompt = {n_rows} rows must be a multiple of {devices} "
                    f"devices x {micro_batches} micro-batches per rollout")
        return None

    def __init__(self, model: Any, tokenizer: Any, cfg: GRPOConfig, *, eos_token_ids: tuple[int, ...] = (),
                 rollout: Rollout | None = None):
        cfg.validate()
        self.tokenizer, self.cfg, self.eos_token_ids = tokenizer, cfg, eos_token_ids
        # the run's rollout (with tools / environments: episodes); default: single-turn from the config
        self.rollout = rollout or Rollout(cfg.rollout, tokenizer, eos_token_ids=eos_token_ids, seed=cfg.train.seed)
        self.model_config = model.config
        self.mesh = meshes.grpo_mesh(cfg.grpo.fsdp, self.training_devices())
        # the training mesh's rows (GRPO's own check: a subclass's `layout_refusal` may count every device, as the
        # asynchronous one does, which keeps some for generation)
        reason = GRPOAlgorithm.layout_refusal(cfg, self.mesh.size)
        if reason:
            raise ValueError(reason)
        ref_path = cfg.grpo.ref_model_path
        ref_model = (lambda: load_any(ref_path, cfg.model.dtype, remat=cfg.model.remat,
                                      **self.load_targets(cfg))[0]) if ref_path else None
        self.learner = GRPOLearner(model, cfg, mesh=self.mesh, ref_model=ref_model,
                                   keep_params=self.syncs_in_background)
        self.rows = meshes.leading_axis(self.mesh, self.learner.batch_axes)
        self.eval_sharding = meshes.replicated(self.mesh)
        self.num_tokens = 0      # TRL's running count of prompt + completion tokens (skipped rollouts too)
        self.ahead = AheadOfTime()                  # train-step programs, made beside the rollouts
        self.last_width: int | None = None          # the last rollout's completion width

    def training_devices(self) -> list[Any] | None:
        """The devices the learner trains on (None: all; asynchronous GRPO keeps some for generation). Called
        once `self.cfg` is set, before the mesh is built."""
        return self.training_devices_of(self.cfg)

    def trains_on_rollout_logprobs(self) -> bool:
        """Whether a batch carries the rollout's log-probs (`make_batch`), which the programs made ahead take."""
        return self.cfg.old_logp_source == "rollout"

    def close(self) -> None:
        """Stop making programs ahead (the one being made finishes)."""
        self.ahead.close()

    @property
    def model(self) -> Any:
        """The current policy (shares the learner's arrays; valid until the next step)."""
        return self.learner.model

    def export_model(self) -> Any:
        """The policy with plain weights for `save_hf` (LoRA: merged into the base)."""
        return self.learner.export_model()

    def export_extra(self, out_dir: str, base_model_path: str) -> dict[str, str]:
        """LoRA: write out_dir/final_adapter (a peft directory) unless grpo.lora.export is "merged"."""
        lora = self.cfg.grpo.lora
        if lora is None or lora.export == "merged":
            return {}
        return {"final_adapter": str(self.learner.save_adapter(f"{out_dir}/final_adapter", base_model_path))}

    # -- checkpointing -------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """The train state in the per-layer layout (whatever layout training uses), so that a checkpoint reads
        the same with or without `model.scan_layers`."""
        s, ref = self.learner.layer_state()
        out = {"step": s.step, "params": s.params, "opt_state": s.opt_state,
               "num_tokens": np.asarray(self.num_tokens, np.int64)}
        if self.cfg.grpo.sync_ref_model:      # the reference moves: resume needs it
            out["ref_params"] = ref
        if s.entropy_control is not None:     # the adaptive entropy controller: resume continues it
            out["entropy_control"] = s.entropy_control
        return out

    def restore_state(self, state: dict[str, Any]) -> None:
        self.learner.load_layer_state(TrainState(state["step"], state["params"], state["opt_state"],
                                                 state.get("entropy_control")), state.get("ref_params"))
        self.num_tokens = int(state["num_tokens"])

    # -- one epoch -------------------------------------------------------------------------------

    def prepare(self, upcoming: list[list[Example]]) -> None:
        """Queue the train-step programs of the coming epochs' prompt widths (`plan_programs`), made beside the
        current work. Prompts that episodes render turn by turn have no width before they run: their programs
        are queued once a rollout met them (`train_step`)."""
        if not self.rollout.prompts_known_ahead:
            return
        for examples in upcoming:           # a too-long prompt is warned about when its epoch runs
            ids, mask, _ = self.rollout.encode(examples, self.model_config, warn=False)
            self.plan_prompts(ids, mask)

    def plan_prompts(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """`plan_programs` for a single-turn rollout of these encoded prompts [P, T], G completions each."""
        self.plan_programs(ids.shape[0] * self.cfg.rollout.generations_per_prompt,
                           min(prompt_width(mask), ids.shape[1]), self.cfg.rollout.max_new_tokens)

    def advantages(self, scores: RowScores, scorer: Scorer, group_size: int, scale: str
                   ) -> tuple[np.ndarray, dict[str, float]]:
        """The advantages of the rollout's rows by `grpo.multi_objective_aggregation`, and (normalize_then_sum) its
        `frac_reward_zero_std`, which replaces the group-std one `reward_metrics` logs."""
        if self.cfg.grpo.multi_objective_aggregation == "sum_then_normalize":
            return np.asarray(compute_advantages(scores.rewards_B, group_size, scale)), {}
        names = list(scores.per_function)
        values_BK = np.stack([np.asarray(scores.per_function[name], np.float32) for name in names], axis=1)
        weights_K = np.asarray([scorer.weights.get(name, 1.0) for name in names], np.float32)
        advantages_B, zero_std = normalized_sum_advantages(values_BK, weights_K, group_size)
        return np.asarray(advantages_B), {"frac_reward_zero_std": float(zero_std)}

    def make_batch(self, ids: np.ndarray, mask: np.ndarray, result: GenerationResult, advantages_B: np.ndarray,
                   tool_mask_BC: np.ndarray | None = None, *, rollout_logprobs: bool | None = None) -> GRPOBatch:
        """The learner's batch; with old log-probs from the rollout (`old_logp_source`) as `old_logp`. `ids`/`mask`
        are per row, or per prompt (repeated per row); `tool_mask_BC` (an episode's, 0 on tool tokens) masks the
        loss; `rollout_logprobs` (default: `old_logp_source`'s "rollout") adds the rollout's log-probs as
        `old_logp`. The step sees no padded work beyond the buckets: prompts cut to `prompt_width`, completions to
        `completion_width` (the rollout's own prompt bucket is generate's)."""
        g = len(advantages_B) // ids.shape[0]          # prompts given once per prompt are repeated per row
        keep = min(prompt_width(mask), ids.shape[1])     # left padding: the columns dropped are padding only
        ids, mask = ids[:, ids.shape[1] - keep:], mask[:, mask.shape[1] - keep:]
        tokens, lengths = rows.gather_rows(result.tokens), rows.gather_rows(result.lengths)
        width = completion_width(lengths, tokens.shape[1])      # no padded work past the longest completion
        tokens = tokens[:, :width]
        completion_mask = np.arange(width)[None, :] < lengths[:, None]
        batch = build_batch(np.repeat(ids, g, 0), np.repeat(mask, g, 0), tokens, completion_mask, advantages_B,
                            self.eos_token_ids, None if tool_mask_BC is None else tool_mask_BC[:, :width],
                            pad_token_id=self.tokenizer.pad_token_id)
        if self.cfg.old_logp_source == "rollout" if rollout_logprobs is None else rollout_logprobs:
            logprobs = np.where(completion_mask, rows.gather_rows(result.logprobs)[:, :width], 0.0).astype(np.float32)
            batch = batch.replace(old_logp_BL=np.pad(logprobs, ((0, 0), (ids.shape[1] - 1, 0))))
        return batch

    # -- programs made ahead of time --------------------------------------------------------------

    def plan_programs(self, rows: int, prompt_columns: int, max_completion: int) -> None:
        """Queue, on the background thread, the programs that training on a rollout of `rows` completions after
        `prompt_columns` prompt columns can need: one per completion bucket (`jaxcore.grpo.buckets`), the most likely
        first (the last rollout's width, then its neighbours), each once per run. Where the thread would take
        cores from the steps it overlaps (the CPU backend on a small host: `spare_host_cores`), only the most
        likely one; the others are made when first met."""
        last = self.last_width or completion_width(np.array([max_completion]), max_completion)
        widths = likely_first(completion_buckets(max_completion), last)
        for width in widths if spare_host_cores() else widths[:1]:
            key = (rows, prompt_columns, width)
            self.ahead.submit(key, functools.partial(self.learner.make_programs, *key,
                                                     rollout_logprobs=self.trains_on_rollout_logprobs()))

    def train_step(self, epoch: int, examples: list[Example], scorer: Scorer) -> StepResult:
        clock = PhaseClock()
        began = time.perf_counter()
        g = self.cfg.rollout.generations_per_prompt
        with clock.phase("rollout"):     # the programs of its prompt width are made beside it (`on_prompts`)
            out = self.rollout.run(self.learner.model, examples, key=self.rollout.epoch_key(epoch), generations=g,
                                   row_sharding=self.rows,
                                   logprobs=self.cfg.old_logp_source == "rollout",   # else the learner's forward
                                   on_prompts=self.plan_prompts)
        return self.train_on(out, scorer, clock, began)

    def train_on(self, out: RolloutOutput, scorer: Scorer, clock: PhaseClock, began: float, *,
                 rollout_logprobs: bool | None = None) -> StepResult:
        """Score a rollout's rows, turn them into advantages and a batch (`make_batch`, with `rollout_logprobs`) and
        train on it: the epoch after its rollout (`clock` and `began` time the whole epoch)."""
        g, scale = self.cfg.rollout.generations_per_prompt, self.cfg.grpo.scale_rewards
        with clock.phase("scoring"):
            scores = self.rollout.score(out, scorer, combined=lambda s: advantage_rewards(s, scorer.fallback))
            rewards_B = scores.rewards_B
            advantages_B, zero_std = self.advantages(scores, scorer, g, scale)
            batch = self.make_batch(out.prompt_ids_BT, out.prompt_mask_BT, out.result, advantages_B,
                                    out.model_mask_BC, rollout_logprobs=rollout_logprobs)
        failed = scores.every_call_failed()
        if failed is not None:              # nothing to learn from: a bad step, not an update on fallbacks
            return StepResult({**{f"rewards/{name}/failures": n for name, n in scores.failures.items()},
                               **clock.metrics()}, skipped=True, reason=failed)
        key = (batch.input_ids_BT.shape[0], batch.completion_start + 1,
               batch.input_ids_BT.shape[1] - batch.completion_start - 1)
        self.plan_programs(*key[:2], out.result.tokens.shape[1])    # those its widths first tell (episodes')
        self.last_width = key[2]
        with clock.phase("update"):
            clock.wait(self.ahead, key)                   # the program being made beside the rollout, if it is
            steps = self.learner.train_on_rollout(batch)   # host floats; stops at the first non-finite step
        ended = time.perf_counter()

        rollout = rollout_metrics(batch)
        self.num_tokens += int(rollout.pop("rollout_tokens"))
        metrics: dict[str, Any] = {
            **scores.metrics,                                   # the reward functions' log_metric values (TRL's)
            **reward_metrics(scores.per_function, rewards_B, g, scale), **zero_std, **rollout,
            **mean_step_metrics(steps),
            **{f"rewards/{name}/failures": n for name, n in scores.failures.items()},
            "num_tokens": self.num_tokens, "prompts/truncated": out.prompts_truncated,
            **clock.metrics(), "step_time": ended - began,      # rollout, scoring, update and compile add up to it
            **out.metrics}
        if not finite(steps[-1]):
            applied = f"; the {len(steps) - 1} before it were applied" if len(steps) > 1 else ""
            return StepResult(metrics, skipped=True, reason=f"non-finite loss, grad norm or update in optimiser step "
                                                            f"{len(steps)} of this rollout{applied}")
        completions = None
        if self.cfg.train.log_completions:
            completions = CompletionLog.of_rollout(self.tokenizer, out.result, out.row_examples, scores.per_function,
                                                   advantages_B, out.messages, scores.columns)
        return StepResult(metrics, completions=completions)
