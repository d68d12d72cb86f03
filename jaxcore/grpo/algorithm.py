"""The GRPO trainer on the shared runtime (`jaxcore grpo`).

Every epoch the runner hands over P prompts; the policy samples G completions per prompt with
`jaxcore.inference.generate` (rows prompt-major, sharded over the batch axes of the mesh), each process scores
the rows it holds, rewards are gathered, turned into group advantages, and `GRPOLearner` takes
`num_iterations` optimiser steps on the rollout. Logged metrics use TRL's names.

Old log-probs (the ratio's denominator) follow TRL: with mu = 1 none are stored (ratio = 1 exactly,
TRL's detached-logp shortcut); with mu > 1 they are the rollout's own log-probs when the rollout
temperature is 1 (generate reports log p under the unscaled logits, which is what the loss uses),
else the learner's temperature-scaled forward at rollout time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import numpy as np

from jaxcore.grpo.advantages import compute_advantages, reward_metrics
from jaxcore.grpo.config import GRPOConfig
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.loss import GRPOLossConfig
from jaxcore.grpo.step import GRPOBatch, GRPOTrainConfig, TrainState, build_batch, rollout_metrics
from jaxcore.hf.model_checkpoint import load_any
from jaxcore.hf.tokenization import decode_completions, encode_prompts_limited, rollout_prompt_limit
from jaxcore.inference.generate import bucket_length, generate, pad_left
from jaxcore.model.lora import LoRAConfig
from jaxcore.parallel import meshes, rows, sharding
from jaxcore.parallel.rows import allgather_sum, local_rows
from jaxcore.rewards import Example, Scorer, ScoreResult
from jaxcore.runtime.runner import StepResult

log = logging.getLogger(__name__)

STEP_METRICS = ("loss", "grad_norm", "entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean",
                "clip_ratio/region_mean", "cispo_clip_ratio", "vespo/phi_seq_mean", "policy_loss")
LOSS_FIELDS = tuple(f.name for f in dataclasses.fields(GRPOLossConfig) if f.name != "max_completion_length")


def train_config(cfg: GRPOConfig) -> GRPOTrainConfig:
    """The learner's settings from a `GRPOConfig` (ValueError for settings GRPO cannot use)."""
    g, opt, r = cfg.grpo, cfg.optimizer, cfg.rollout
    if opt.name not in ("adam", "adamw"):
        raise ValueError(f"optimizer.name={opt.name}: GRPO trains with AdamW (set optimizer.name=adamw)")
    if opt.schedule not in ("constant", "cosine", "linear"):
        raise ValueError(f"optimizer.schedule={opt.schedule}: GRPO supports linear, cosine or constant")
    if r.temperature <= 0:
        raise ValueError("rollout.temperature must be > 0 for GRPO (greedy completions of a prompt are identical)")
    if r.generations_per_prompt < 2:
        raise ValueError("rollout.generations_per_prompt must be >= 2 for GRPO (advantages are relative to a group)")
    if g.scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"grpo.scale_rewards={g.scale_rewards}: expected group, batch or none")
    lora = None
    if g.lora is not None:
        if g.lora.export not in ("merged", "adapter", "both"):
            raise ValueError(f"grpo.lora.export={g.lora.export}: expected merged, adapter or both")
        lora = LoRAConfig(rank=g.lora.rank, alpha=g.lora.alpha, target_modules=tuple(g.lora.target_modules),
                          dropout=g.lora.dropout, base_dtype=g.lora.base_dtype)
    steps_per_rollout = (g.steps_per_generation or g.gradient_accumulation_steps) // g.gradient_accumulation_steps
    return GRPOTrainConfig(
        **{name: getattr(g, name) for name in LOSS_FIELDS}, max_completion_length=r.max_new_tokens,
        learning_rate=opt.learning_rate, lr_schedule=opt.schedule, warmup_steps=opt.warmup_steps,
        total_steps=cfg.train.epochs * g.num_iterations * max(steps_per_rollout, 1),
        weight_decay=opt.weight_decay, adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2,
        adam_epsilon=opt.adam_epsilon, max_grad_norm=opt.max_grad_norm or 0.0,
        gradient_accumulation_steps=g.gradient_accumulation_steps, steps_per_generation=g.steps_per_generation,
        num_iterations=g.num_iterations, mask_truncated_completions=g.mask_truncated_completions,
        temperature=r.temperature, sync_ref_model=g.sync_ref_model, ref_model_mixup_alpha=g.ref_model_mixup_alpha,
        ref_model_sync_steps=g.ref_model_sync_steps, lora=lora, seed=cfg.train.seed)


def make_grpo_mesh(fsdp: int) -> jax.sharding.Mesh:
    """All devices: a "data" axis, times an "fsdp" axis when `fsdp > 1`."""
    if fsdp < 1:
        raise ValueError(f"grpo.fsdp={fsdp} must be >= 1")
    return meshes.make_mesh({"data": -1, "fsdp": fsdp} if fsdp > 1 else {"data": -1})


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


def finite(step: dict[str, float]) -> bool:
    """Whether an optimiser step's loss and gradient norm are finite (the learner skipped it if not)."""
    return bool(np.isfinite(step["loss"]) and np.isfinite(step["grad_norm"]))


def mean_step_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """The mu optimiser steps' metrics averaged (learning rate: the last step's)."""
    out = {k: float(np.mean([s[k] for s in steps])) for k in STEP_METRICS if k in steps[0]}
    out["learning_rate"] = steps[-1]["learning_rate"]
    return out


class GRPOAlgorithm:
    """GRPO on a jaxcore model: grouped rollouts, scoring, advantages, clipped policy-gradient steps."""

    def __init__(self, model: Any, tokenizer: Any, cfg: GRPOConfig, *, eos_token_ids: tuple[int, ...] = ()):
        self.tokenizer, self.cfg, self.eos_token_ids = tokenizer, cfg, eos_token_ids
        train_cfg = train_config(cfg)
        self.mesh = make_grpo_mesh(cfg.grpo.fsdp)
        rows = cfg.rollout.prompts_per_epoch * cfg.rollout.generations_per_prompt
        split = self.mesh.size * train_cfg.generation_steps
        if rows % split:
            raise ValueError(f"prompts_per_epoch x generations_per_prompt = {rows} rows must be a multiple of "
                             f"{self.mesh.size} devices x {train_cfg.generation_steps} micro-batches per rollout")
        ref_path = cfg.grpo.ref_model_path
        ref_model = (lambda: load_any(ref_path, cfg.model.dtype, remat=cfg.model.remat,
                                      **sharding.load_targets(cfg))[0]) if ref_path else None
        self.learner = GRPOLearner(model, train_cfg, mesh=self.mesh, ref_model=ref_model)
        self.rows = meshes.leading_axis(self.mesh, self.learner.batch_axes)
        self.eval_sharding = meshes.replicated(self.mesh)
        self.num_tokens = 0      # TRL's running count of prompt + completion tokens (skipped rollouts too)

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
        s = self.learner.state
        out = {"step": s.step, "params": s.params, "opt_state": s.opt_state,
               "num_tokens": np.asarray(self.num_tokens, np.int64)}
        if self.learner.cfg.sync_ref_model:      # the reference moves: resume needs it
            out["ref_params"] = self.learner.ref[1]
        return out

    def restore_state(self, state: dict[str, Any]) -> None:
        self.learner.state = TrainState(state["step"], state["params"], state["opt_state"])
        self.num_tokens = int(state["num_tokens"])
        if "ref_params" in state:
            graphdef, _, rest = self.learner.ref
            self.learner.ref = graphdef, state["ref_params"], rest

    # -- one epoch -------------------------------------------------------------------------------

    def encode(self, examples: list[Example]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompt ids/mask, widened to a length bucket (one compiled train step per bucket)."""
        r = self.cfg.rollout
        limit = rollout_prompt_limit(r, self.learner.model.config)
        ids, mask, self.prompts_truncated = encode_prompts_limited(
            self.tokenizer, [e.prompt for e in examples], limit, r.max_new_tokens, chat_template=r.chat_template,
            system=r.system_prompt)
        length = max(ids.shape[1], min(bucket_length(ids.shape[1]), limit.max_positions - r.max_new_tokens))
        return pad_left(ids, mask, length, self.tokenizer.pad_token_id)

    def rollout(self, epoch: int, ids: np.ndarray, mask: np.ndarray) -> Any:
        """G sampled completions per prompt (prompt-major rows, sharded over the batch axes)."""
        r = self.cfg.rollout
        key = jax.random.fold_in(jax.random.key(self.cfg.train.seed), epoch)
        return generate(self.learner.model, ids, mask, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                        top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, eos_token_ids=self.eos_token_ids,
                        num_return_sequences=r.generations_per_prompt, key=key,
                        pad_token_id=self.tokenizer.pad_token_id, row_sharding=self.rows)

    def score(self, result: Any, row_examples: list[Example], scorer: Scorer
              ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
        """Each process scores the rows it holds; (rewards, per-function values, failures) for all rows."""
        rows, tokens = local_rows(result.tokens)
        _, lengths = local_rows(result.lengths)
        texts = decode_completions(self.tokenizer, tokens, lengths)
        scores = scorer.score(texts, [row_examples[i] for i in rows])
        size = len(row_examples)

        def full(values: np.ndarray) -> np.ndarray:
            out = np.zeros(size, np.float64)
            out[rows] = values
            return allgather_sum(out)

        rewards = full(advantage_rewards(scores, scorer.fallback))
        per_function = {name: full(values) for name, values in scores.per_function.items()}
        names = list(scores.failures)
        failures = allgather_sum(np.array([scores.failures[n] for n in names], np.int64))
        return rewards, per_function, dict(zip(names, failures.tolist()))

    def make_batch(self, ids: np.ndarray, mask: np.ndarray, result: Any, advantages_B: np.ndarray) -> GRPOBatch:
        """The learner's batch; with mu > 1 at temperature 1 the rollout log-probs become `old_logp`."""
        g = self.cfg.rollout.generations_per_prompt
        tokens, lengths = rows.gather_rows(result.tokens), rows.gather_rows(result.lengths)
        completion_mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
        batch = build_batch(np.repeat(ids, g, 0), np.repeat(mask, g, 0), tokens, completion_mask, advantages_B,
                            self.eos_token_ids)
        if self.learner.needs_old_logp() and self.learner.cfg.temperature == 1.0:
            logprobs = np.where(completion_mask, rows.gather_rows(result.logprobs), 0.0).astype(np.float32)
            batch = batch.replace(old_logp_BL=np.pad(logprobs, ((0, 0), (ids.shape[1] - 1, 0))))
        return batch

    def train_step(self, epoch: int, examples: list[Example], scorer: Scorer) -> StepResult:
        began = time.perf_counter()
        g, scale = self.cfg.rollout.generations_per_prompt, self.cfg.grpo.scale_rewards
        ids, mask = self.encode(examples)
        result = self.rollout(epoch, ids, mask)
        rolled = time.perf_counter()
        rewards_B, per_function, failures = self.score(result, [e for e in examples for _ in range(g)], scorer)
        advantages_B = np.asarray(compute_advantages(rewards_B, g, scale))
        batch = self.make_batch(ids, mask, result, advantages_B)
        scored = time.perf_counter()
        steps = self.update(batch)

        rollout = rollout_metrics(batch)
        self.num_tokens += int(rollout.pop("rollout_tokens"))
        metrics: dict[str, Any] = {
            **reward_metrics(per_function, rewards_B, g, scale), **rollout, **mean_step_metrics(steps),
            **{f"rewards/{name}/failures": n for name, n in failures.items()},
            "num_tokens": self.num_tokens, "prompts/truncated": self.prompts_truncated,
            "timing/rollout": rolled - began, "timing/scoring": scored - rolled,
            "timing/update": time.perf_counter() - scored, "step_time": time.perf_counter() - began}
        if not finite(steps[-1]):
            applied = f"; the {len(steps) - 1} before it were applied" if len(steps) > 1 else ""
            return StepResult(metrics, skipped=True, reason=f"non-finite loss or grad norm in optimiser step "
                                                            f"{len(steps)} of this rollout{applied}")
        return StepResult(metrics)

    def update(self, batch: GRPOBatch) -> list[dict[str, float]]:
        """`num_iterations` passes of the rollout's optimiser steps, stopping at the first non-finite one
        (which `GRPOLearner` does not apply)."""
        batches, num_items = self.learner.step_batches(self.learner.prepare(batch))
        steps: list[dict[str, float]] = []
        for _ in range(self.learner.cfg.num_iterations):
            for step_batch in batches:
                steps.append(self.learner.step(step_batch, num_items))
                if not finite(steps[-1]):
                    return steps
        return steps
