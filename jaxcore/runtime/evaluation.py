"""Held-out evaluation, shared by every algorithm and the trainers' `evaluate()`: the examples drawn with a fixed
seed, one greedy completion each (or several sampled ones), scored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxcore.hf import tokenization
from jaxcore.inference.generate import row_shards
from jaxcore.parallel.rows import gather_rows
from jaxcore.rewards import Example, Scorer
from jaxcore.runtime.rollout import Rollout, function_means

EVAL_SEED = 0          # the held-out examples are drawn with this seed, whatever train.seed is


def eval_batches(examples: list[Example], batch_size: int, row_sharding: Any = None, samples_per_prompt: int = 0
                 ) -> Iterator[tuple[int, list[Example], jax.Array | None]]:
    """`evaluate`'s batches, in order: (how many examples the batch has, its rows: those examples padded with the
    last one to a multiple of the row shards, its sampling key: None for greedy completions)."""
    if samples_per_prompt:
        examples = [e for e in examples for _ in range(samples_per_prompt)]
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        key = jax.random.fold_in(jax.random.key(EVAL_SEED), start) if samples_per_prompt else None
        yield len(chunk), chunk + chunk[-1:] * (-len(chunk) % row_shards(row_sharding)), key


def evaluate(model: Any, examples: list[Example], scorer: Scorer, rollout: Rollout, *, batch_size: int,
             row_sharding: Any = None, samples_per_prompt: int = 0) -> dict[str, Any]:
    """Completions for held-out examples, scored: mean reward, per-function means, samples. One greedy completion
    per example, or with `samples_per_prompt` k > 0 k completions sampled with the rollout's settings (TRL's
    `num_generations_eval`) from a fixed key, so that every evaluation of a run draws alike.

    The run's `Rollout` makes and scores the rows (each process scores the rows it owns; with tools or
    environments every row is an episode, its environment's reward and turn/tool statistics logged too);
    `batch_size` rows per batch. With `row_sharding` (e.g. rows over a mesh axis, or replicated over a
    multi-process mesh) the batch lives on that mesh.
    """
    rewards: list[np.ndarray] = []
    per_function: dict[str, list[np.ndarray]] = {name: [] for name in [*scorer.reward_fns, *rollout.reward_names]}
    episode_metrics: list[dict[str, float]] = []
    logged: dict[str, list[float]] = {}                 # the reward functions' log_metric means, per batch (TRL's)
    samples: list[dict[str, str]] = []
    for count, rows, key in eval_batches(examples, batch_size, row_sharding, samples_per_prompt):
        chunk = rows[:count]
        out = rollout.run(model, rows, key=key, row_sharding=row_sharding, logprobs=False)
        scores = rollout.score(out, scorer, padding_from=count)
        episode_metrics.append(out.metrics)
        for name, mean in scores.metrics.items():
            logged.setdefault(name, []).append(mean)
        rewards.append(scores.rewards_B[:count])
        for name, values in scores.per_function.items():
            per_function[name].append(values[:count])
        if len(samples) < 3:
            shown = min(3 - len(samples), count)
            texts = tokenization.decode_completions(rollout.tokenizer, gather_rows(out.result.tokens)[:shown],
                                                    gather_rows(out.result.lengths)[:shown])
            samples.extend({"prompt": e.prompt, "completion": t} for e, t in zip(chunk, texts))
    rewards_B = np.concatenate(rewards).astype(np.float32) if rewards else np.zeros(0, np.float32)
    means = function_means({name: np.concatenate(v) if v else np.zeros(0) for name, v in per_function.items()})
    episodes = {f"eval/{k}": float(np.mean([m[k] for m in episode_metrics])) for k in
                (episode_metrics[0] if episode_metrics else ()) if k.startswith(("tools/", "episodes/"))}
    return {**{f"eval/{name}": float(np.mean(values)) for name, values in logged.items()},
            "eval/reward": float(rewards_B.mean()), **{f"eval/rewards/{name}/mean": m for name, m in means.items()},
            **episodes, "eval/samples": samples}
