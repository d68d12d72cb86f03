"""The one rollout path (`Rollout`), shared by both algorithms, evaluation and the memory planner: encode the
prompts under the rollout's limits and sample completions with its settings, or run every row as a multi-turn
episode (`jaxcore.agents`); then score the rows, each process scoring only the rows it holds and the values of
every row summed over processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxcore.agents import run_episodes
from jaxcore.hf.tokenization import (
    decode_completions,
    encode_prompts,
    encode_prompts_limited,
    rollout_prompt_limit,
)
from jaxcore.inference.generate import GenerationResult, generate, pad_left, prompt_bucket
from jaxcore.parallel.rows import allgather_json, allgather_sum, owned_rows
from jaxcore.rewards import Example, Scorer, ScoreResult
from jaxcore.rewards.user_functions import Completion
from jaxcore.runtime.config import RolloutConfig


@dataclasses.dataclass
class RolloutOutput:
    """One rollout's rows, whatever made them (Tunix's `RolloutOutput`): every row's example and prompt, the
    generation, which completion tokens the model generated, and what scoring and logging take besides."""

    row_examples: list[Example]        # every row's example, its prompt as the model saw it (an episode's: reset)
    prompt_ids_BT: np.ndarray          # every row's prompt, left-padded (host)
    prompt_mask_BT: np.ndarray
    result: GenerationResult           # completion tokens [B, C], placed like a `generate` result
    model_mask_BC: np.ndarray | None = None    # 1 where the model generated the token; None: it made them all
    prompts_truncated: int = 0
    scoring: dict[str, Any] = dataclasses.field(default_factory=dict)   # `score_rows`' further arguments
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)   # turn / tool statistics
    messages: list[list[dict[str, Any]]] | None = None     # every row's completion as messages (multi-turn)


class Rollout:
    """The run's one way to roll out, built once from the rollout settings, the tokenizer and the optional agent
    (tools and environments, or a rollout_func: `jaxcore.agents`), and used by both algorithms, evaluation and
    the memory planner. Without an agent every row is one completion of its prompt; with one, an episode."""

    def __init__(self, settings: RolloutConfig, tokenizer: Any, *, eos_token_ids: tuple[int, ...] = (),
                 agent: Any = None, seed: int = 0):
        self.settings, self.tokenizer, self.eos_token_ids = settings, tokenizer, tuple(eos_token_ids)
        self.agent, self.seed = agent, seed

    @property
    def reward_names(self) -> list[str]:
        """The reward sources the rollout adds to the reward functions (an environment's `get_reward`)."""
        return [] if self.agent is None else list(self.agent.reward_names)

    @property
    def prompts_known_ahead(self) -> bool:
        """Whether `encode` gives the prompts before the rollout runs (not so for episodes, which render them
        turn by turn: with an environment's reset text, tool descriptions, ...)."""
        return self.agent is None

    def epoch_key(self, epoch: int) -> jax.Array:
        """The sampling key of training epoch `epoch` (a pure function of the run's seed and the epoch)."""
        return jax.random.fold_in(jax.random.key(self.seed), epoch)

    def encode(self, examples: Sequence[Example], model_config: Any, *, warn: bool = True
               ) -> tuple[np.ndarray, np.ndarray, int]:
        """Left-padded prompt ids and mask [P, T] of the examples under the rollout's prompt limit, widened to the
        prompt bucket generation pads them to (`prompt_bucket`), and how many were truncated (`warn`: logged)."""
        r = self.settings
        ids, mask, truncated = encode_prompts_limited(
            self.tokenizer, [e.prompt for e in examples], rollout_prompt_limit(r, model_config), r.max_new_tokens,
            chat_template=r.chat_template, system=r.system_prompt, vocab_size=model_config.vocab_size, warn=warn)
        width = prompt_bucket(ids.shape[1], model_config.max_position_embeddings - r.max_new_tokens)
        return (*pad_left(ids, mask, width, self.tokenizer.pad_token_id), truncated)

    def generate(self, model: Any, ids: np.ndarray, mask: np.ndarray, *, key: jax.Array | None,
                 generations: int = 1, row_sharding: Any = None, logprobs: bool = True) -> GenerationResult:
        """`generations` completions of every prompt row with the rollout's sampling settings; with `key` None
        greedy (held-out evaluation). `logprobs=False` where nothing reads them (ES, evaluation)."""
        return generate(model, ids, mask, max_new_tokens=self.settings.max_new_tokens,
                        sampling=self.settings.sampling(greedy=key is None), eos_token_ids=self.eos_token_ids,
                        num_return_sequences=generations, key=key, pad_token_id=self.tokenizer.pad_token_id,
                        row_sharding=row_sharding, logprobs=logprobs)

    def run(self, model: Any, examples: Sequence[Example], *, key: jax.Array | None, generations: int = 1,
            members: int = 1, row_sharding: Any = None, logprobs: bool = True,
            on_prompts: Callable[[np.ndarray, np.ndarray], None] | None = None) -> RolloutOutput:
        """Roll out `generations` completions of every example for each of `members` (an ES population's rows:
        member-major, then prompt-major), rows placed with `row_sharding`; with `key` None greedily. Without an
        agent, `on_prompts` gets the encoded prompts [P, T] before generation starts (to prepare work for the rows
        to come); an agent's episodes encode their prompts per turn."""
        row_examples = [e for e in examples for _ in range(generations)] * members
        if self.agent is not None:     # every row an episode with its own environment instance
            episodes = run_episodes(self.agent, model, self.tokenizer, row_examples, self.settings, key=key,
                                    eos_token_ids=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id,
                                    row_sharding=row_sharding)
            row_examples = [dataclasses.replace(e, prompt=p)          # the prompt with its reset() text
                            for e, p in zip(row_examples, episodes.reward_prompts, strict=True)]
            return RolloutOutput(row_examples, episodes.prompt_ids_BT, episodes.prompt_mask_BT, episodes.result,
                                 episodes.model_mask_BE, episodes.prompts_truncated, episodes.scoring(),
                                 episodes.metrics(), episodes.messages)
        ids, mask, truncated = self.encode(examples, model.config)
        if on_prompts is not None:
            on_prompts(ids, mask)
        ids, mask = np.tile(ids, (members, 1)), np.tile(mask, (members, 1))
        result = self.generate(model, ids, mask, key=key, generations=generations, row_sharding=row_sharding,
                               logprobs=logprobs)
        return RolloutOutput(row_examples, np.repeat(ids, generations, 0), np.repeat(mask, generations, 0),
                             jax.block_until_ready(result), prompts_truncated=truncated)

    def score(self, output: RolloutOutput, scorer: Scorer, *,
              combined: Callable[[ScoreResult], np.ndarray] | None = None,
              padding_from: int | None = None) -> RowScores:
        """`score_rows` of a rollout's rows, with what its episodes add (environment rewards, messages, ...)."""
        return score_rows(output.result, output.row_examples, self.tokenizer, scorer, combined=combined,
                          padding_from=padding_from, **output.scoring)

    def prompt_lengths(self, examples: Sequence[Example]) -> list[int]:
        """Each example's prompt in tokens as the rollout renders it (chat template, system prompt; with an agent
        the tools' description: one environment instance per environment name, never reset, so a reset's text is
        not counted), before any limit: what the memory planner measures."""
        r = self.settings
        if self.agent is None:
            return encode_prompts(self.tokenizer, [e.prompt for e in examples], chat_template=r.chat_template,
                                  system=r.system_prompt)[1].sum(1).tolist()
        envs = self.agent.environments
        named = {} if envs is None else {envs.name_of(e): e for e in reversed(examples)}     # one row per name
        instance = dict(zip(named, envs.instances(list(named.values())))) if envs is not None else {}
        texts = [self.agent.prompt_text(self.tokenizer, e, None,
                                        instance.get(envs.name_of(e)) if envs is not None else None, r.system_prompt)
                 for e in examples]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]


@dataclasses.dataclass
class RowScores:
    """The scores of every row of a rollout (all processes)."""

    rewards_B: np.ndarray                 # the combined reward per row
    per_function: dict[str, np.ndarray]   # each function's value per row (NaN where it gave none)
    failures: dict[str, int]              # per function: rows that got the fallback
    lengths_B: np.ndarray                 # completion tokens per row
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)     # TRL's log_metric: each name's mean
    columns: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # TRL's log_extra: a value per row
    errors: dict[str, str] = dataclasses.field(default_factory=dict)    # this process's first failure per function

    def every_call_failed(self) -> str | None:
        """Why no row has a reward of its own, when every call of every reward function failed (every value a
        fallback; a rollout scored by its environments as well has rewards of those): the first function's first
        failure, else None."""
        scored = len(self.rewards_B)
        if not self.failures or scored == 0 or any(n < scored for n in self.failures.values()):
            return None
        if set(self.per_function) - set(self.failures):                    # an environment's get_reward
            return None
        name = next(iter(self.failures))
        return f"every reward call failed; reward {name!r}: {self.errors.get(name, 'failed')}"


def with_extra(scores: ScoreResult, extra: Mapping[str, np.ndarray]) -> ScoreResult:
    """`scores` with extra reward sources (an environment's `get_reward`, weight 1, NaN where it gave none) added
    as functions: to `per_function`, and to the combined reward (TRL's nansum)."""
    if not extra:
        return scores
    added_B = np.nansum(np.stack([np.asarray(v, np.float64) for v in extra.values()]), axis=0)
    return dataclasses.replace(scores, rewards_B=(scores.rewards_B + added_B).astype(np.float32),
                               per_function={**scores.per_function, **extra})


def score_rows(result: GenerationResult, row_examples: Sequence[Example], tokenizer: Any, scorer: Scorer, *,
               combined: Callable[[ScoreResult], np.ndarray] | None = None,
               extra: Mapping[str, np.ndarray] | None = None, environments: Sequence[Any] | None = None,
               messages: Sequence[list[dict[str, Any]]] | None = None, prompts: Sequence[Any] | None = None,
               padding_from: int | None = None, columns: Sequence[Mapping[str, Any]] | None = None) -> RowScores:
    """Each process decodes and scores the rows of `result` it owns (a row held by several processes is scored
    once, by the first); every row's values, summed over processes. `combined` turns a batch's `ScoreResult`
    into the reward per row (default: its weighted sum); `extra` are further reward values of every row
    (`with_extra`: a multi-turn rollout's environment rewards); `environments` every row's environment instance
    (TRL's `environments=` of the reward functions; a process holds those of its own rows); `messages` every
    row's completion as messages and `prompts` every row's prompt as the model saw it (a multi-turn rollout's
    `Episodes.messages` and `reward_prompts`, each process's own rows): what the reward functions get. Rows from
    `padding_from` on only fill a batch to the row shards: no reward function sees them (their values are 0).
    `columns`: further columns of every row (a rollout_func's extra keys), added to its example's."""
    rows, tokens = owned_rows(result.tokens)
    _, lengths = owned_rows(result.lengths)
    if padding_from is not None:
        real = rows < padding_from
        rows, tokens, lengths = rows[real], tokens[real], lengths[real]
    completions, examples = decode_completions(tokenizer, tokens, lengths), [row_examples[i] for i in rows]
    if messages is not None:
        completions = [Completion(str(c), c.ids, messages[r]) for c, r in zip(completions, rows)]
    if prompts is not None:
        examples = [dataclasses.replace(e, prompt=prompts[r]) for e, r in zip(examples, rows)]
    if columns is not None:
        examples = [dataclasses.replace(e, columns={**e.columns, **columns[r]}) for e, r in zip(examples, rows)]
    # environments only when there are some: a Scorer subclass written before they existed keeps working
    scores = (scorer.score(completions, examples) if environments is None else
              scorer.score(completions, examples, environments=[environments[i] for i in rows]))
    scores = with_extra(scores, {name: np.asarray(values)[rows] for name, values in (extra or {}).items()})
    size = len(row_examples)

    def every_row(values: np.ndarray) -> np.ndarray:
        out = np.zeros(size, np.float64)
        out[rows] = values
        return allgather_sum(out)

    names = list(scores.failures)
    failures = allgather_sum(np.array([scores.failures[n] for n in names], np.int64))
    return RowScores(rewards_B=every_row(scores.rewards_B if combined is None else combined(scores)),
                     per_function={name: every_row(values) for name, values in scores.per_function.items()},
                     failures=dict(zip(names, failures.tolist())), lengths_B=every_row(lengths),
                     metrics=metric_means(scores.metrics),
                     columns=every_row_of_columns(scores.columns, rows, size), errors=scores.errors)


def metric_means(logged: dict[str, list[float]]) -> dict[str, float]:
    """Each name's mean over the values every process's reward calls gave TRL's `log_metric` (TRL: the total over
    the count, across processes)."""
    totals = {name: [float(np.sum(values)), float(len(values))] for name, values in logged.items()}
    merged: dict[str, list[float]] = {}
    for process in allgather_json(totals):
        for name, (total, count) in process.items():
            merged.setdefault(name, [0.0, 0.0])
            merged[name][0] += total
            merged[name][1] += count
    return {name: total / count for name, (total, count) in sorted(merged.items()) if count}


def every_row_of_columns(columns: dict[str, list[Any]], rows: np.ndarray, size: int) -> dict[str, list[Any]]:
    """TRL's `log_extra` columns of this process's scored `rows`, as values of every row of the rollout (each
    process's, gathered; a value JSON cannot hold as its text)."""
    local = {name: {int(r): value for r, value in zip(rows, values)} for name, values in columns.items()}
    out: dict[str, list[Any]] = {}
    for process in allgather_json(local):
        for name, values in process.items():
            column = out.setdefault(name, [None] * size)
            for row, value in values.items():
                column[int(row)] = value
    return out


def function_means(per_function: dict[str, np.ndarray]) -> dict[str, float]:
    """Each reward function's mean over the rows it scored (NaN when it scored none)."""
    return {name: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for name, v in per_function.items()}
