"""One rollout, shared by every algorithm: encode the epoch's prompts under the rollout's limits, sample
completions with its settings, and score them, each process scoring only the rows it holds and the
values of every row summed over processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxcore.hf.tokenization import decode_completions, encode_prompts_limited, rollout_prompt_limit
from jaxcore.inference.generate import GenerationResult, generate
from jaxcore.parallel.rows import allgather_sum, owned_rows
from jaxcore.rewards import Example, Scorer, ScoreResult
from jaxcore.rewards.user_functions import Completion
from jaxcore.runtime.config import RolloutConfig


def encode_rollout_prompts(tokenizer: Any, examples: Sequence[Example], rollout: RolloutConfig, model_config: Any,
                           *, warn: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Left-padded prompt ids and mask [B, T] under the rollout's prompt limit, and how many were truncated
    (`warn`: log a truncation; `limit_prompts`)."""
    return encode_prompts_limited(tokenizer, [e.prompt for e in examples], rollout_prompt_limit(rollout, model_config),
                                  rollout.max_new_tokens, chat_template=rollout.chat_template,
                                  system=rollout.system_prompt, vocab_size=model_config.vocab_size,
                                  warn=warn)


def sample(model: Any, ids: np.ndarray, mask: np.ndarray, rollout: RolloutConfig, *, key: jax.Array | None,
           eos_token_ids: tuple[int, ...], pad_token_id: int, row_sharding: Any = None,
           num_return_sequences: int = 1, logprobs: bool = True) -> GenerationResult:
    """Completions of every prompt row with the rollout's sampling settings; with `key` None greedy
    (temperature 0, no filters: held-out evaluation). `logprobs=False` where nothing reads them (ES, evaluation)."""
    settings = (dict(temperature=0.0) if key is None else
                dict(temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p, min_p=rollout.min_p,
                     repetition_penalty=rollout.repetition_penalty))
    return generate(model, ids, mask, max_new_tokens=rollout.max_new_tokens, **settings, eos_token_ids=eos_token_ids,
                    num_return_sequences=num_return_sequences, key=key, pad_token_id=pad_token_id,
                    row_sharding=row_sharding, logprobs=logprobs)


@dataclasses.dataclass
class RowScores:
    """The scores of every row of a rollout (all processes)."""

    rewards_B: np.ndarray                 # the combined reward per row
    per_function: dict[str, np.ndarray]   # each function's value per row (NaN where it gave none)
    failures: dict[str, int]              # per function: rows that got the fallback
    lengths_B: np.ndarray                 # completion tokens per row


def with_extra(scores: ScoreResult, extra: Mapping[str, np.ndarray]) -> ScoreResult:
    """`scores` with extra reward sources (an environment's `get_reward`, weight 1, NaN where it gave none) added
    as functions: to `per_function`, and to the combined reward (TRL's nansum)."""
    if not extra:
        return scores
    added_B = np.nansum(np.stack([np.asarray(v, np.float64) for v in extra.values()]), axis=0)
    return ScoreResult((scores.rewards_B + added_B).astype(np.float32), {**scores.per_function, **extra},
                       scores.failures)


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
                     failures=dict(zip(names, failures.tolist())), lengths_B=every_row(lengths))


def function_means(per_function: dict[str, np.ndarray]) -> dict[str, float]:
    """Each reward function's mean over the rows it scored (NaN when it scored none)."""
    return {name: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for name, v in per_function.items()}
