"""TRL's `rollout_func`: a user function generates every row's completion (an external generator, a scripted
environment), and training takes its token ids as it takes a multi-turn episode's (`Episodes`).

TRL calls `rollout_func(prompts, trainer)` with the rows' prompts (one per completion) and reads back a dict with
`prompt_ids`, `completion_ids` and `logprobs` (a list per row); any other key goes to the reward functions as a
column (a list: one value per row; anything else: the same value for every row), and `env_mask` marks the
completion tokens the model generated (1) against those the environment inserted (0), which the loss skips.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxcore.agents.episodes import Episodes, left_pad
from jaxcore.errors import TaskError
from jaxcore.hf.tokenization import apply_chat_template, is_conversation
from jaxcore.inference.generate import GenerationResult, place_rows
from jaxcore.rewards import Example

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
IGNORED_KEYS = ("logprob_token_ids",)          # TRL's vLLM importance correction; jaxcore has none


class RolloutFunction:
    """The run's rollout by a user function (in place of tools and environments); `owner` is what the function gets
    as TRL's `trainer`. Completions longer than `max_episode_tokens` are cut there (counted, warned)."""

    environments = None

    def __init__(self, fn: Callable[[list[Any], Any], dict[str, Any]], owner: Any, *, max_episode_tokens: int):
        if not callable(fn):
            raise TypeError(f"rollout_func must be callable, got {type(fn).__name__}")
        self.fn, self.owner, self.max_episode_tokens = fn, owner, max_episode_tokens

    @property
    def reward_names(self) -> list[str]:
        """No environment rewards: the reward functions score the rows."""
        return []

    def close(self) -> None:
        return None

    def prompt_text(self, tokenizer: Any, example: Example, observation: Any, instance: Any,
                    system: str | None) -> str:
        """A row's prompt as a single-turn rollout renders it (what `jaxcore plan` measures its length by)."""
        if is_conversation(example.prompt) or system:
            return apply_chat_template(tokenizer, example.prompt, system)
        return str(example.prompt)

    def episodes(self, model: Any, tokenizer: Any, examples: Sequence[Example], *, pad_token_id: int,
                 eos_token_ids: Sequence[int], row_sharding: Any = None) -> Any:
        """Call the function on every row's prompt (a copy, as TRL passes) and lay its ids out as `Episodes`."""
        if jax.process_count() > 1:
            raise TaskError("rollout_func runs in one process only: jaxcore calls it once for every row of the "
                            "rollout, and several processes would each get different completions")
        output = self.fn(copy.deepcopy([e.prompt for e in examples]), self.owner)
        rows = checked_output(output, len(examples), model.config.vocab_size)
        b, budget = len(examples), self.max_episode_tokens
        prompts = rows["prompt_ids"]
        completions = [list(c[:budget]) for c in rows["completion_ids"]]
        hit_limit_B = np.array([len(c) > budget for c in rows["completion_ids"]])
        if hit_limit_B.any():
            log.warning("%d of %d rollout_func completions are longer than max_completion_length=%d: cut there",
                        int(hit_limit_B.sum()), b, budget)
        width = max(len(p) for p in prompts)
        if width + budget > model.config.max_position_embeddings:
            raise TaskError(f"rollout_func: a prompt of {width} tokens and "
                            f"{budget} completion tokens pass the model's {model.config.max_position_embeddings} "
                            "positions")
        env_mask = rows.get("env_mask")
        tokens_BE = np.full((b, budget), pad_token_id, np.int32)
        model_mask_BE = np.zeros((b, budget), np.int32)
        for r, completion in enumerate(completions):
            tokens_BE[r, :len(completion)] = completion
            model_mask_BE[r, :len(completion)] = 1 if env_mask is None else np.asarray(env_mask[r][:budget])
        lengths_B = np.array([len(c) for c in completions], np.int32)
        eos = set(int(e) for e in eos_token_ids)
        finished_B = np.array([bool(c) and c[-1] in eos and not cut for c, cut in zip(completions, hit_limit_B)])
        place = functools.partial(place_rows, row_sharding=row_sharding)
        result = GenerationResult(place(tokens_BE), place(np.zeros((b, budget), np.float32)), place(lengths_B),
                                  place(finished_B))
        prompt_ids, prompt_mask = left_pad(prompts, width, pad_token_id)
        zeros = np.zeros(b, np.int64)
        columns = [{k: v[r] for k, v in rows["columns"].items()} for r in range(b)]
        return Episodes(prompt_ids, prompt_mask, result, model_mask_BE, {}, {}, zeros, zeros, np.ones(b, np.int64),
                        hit_limit_B, 0, None, [], [e.prompt for e in examples], columns=columns)


def checked_output(output: Any, rows: int, vocab_size: int) -> dict[str, Any]:
    """The function's output checked (TRL's message for a missing key; each list one entry per row, each id in the
    vocabulary: one line naming what is wrong), its other keys as per-row columns."""
    if not isinstance(output, dict):
        raise TaskError(f"rollout_func must return a dict, got {type(output).__name__}")
    missing = sorted(set(REQUIRED_KEYS) - output.keys())
    if missing:
        raise TaskError(f"rollout_func must return keys {missing} in its output dict.")
    checked: dict[str, Any] = {}
    for key in ("prompt_ids", "completion_ids", "env_mask"):
        if key not in output:
            continue
        value = output[key]
        if not isinstance(value, (list, tuple)) or len(value) != rows:
            size = f" of {len(value)}" if hasattr(value, "__len__") else ""
            raise TaskError(f"rollout_func's {key}: expected a list of {rows} token-id lists (one per row of the "
                            f"rollout), got {type(value).__name__}{size}")
        lists = [_integers(row, key, r) for r, row in enumerate(value)]
        if key != "env_mask" and any(not 0 <= t < vocab_size for row in lists for t in row):
            raise TaskError(f"rollout_func's {key}: a token id outside the model's vocabulary of {vocab_size}")
        checked[key] = lists
    mask = checked.get("env_mask")
    if mask is not None and any(len(m) != len(c) or set(m) - {0, 1} for m, c in zip(mask, checked["completion_ids"])):
        raise TaskError("rollout_func's env_mask: each row must be a 0/1 list as long as its completion_ids row")
    if not all(checked["prompt_ids"]):
        raise TaskError("rollout_func's prompt_ids: a row has an empty prompt")
    extra = {k: v for k, v in output.items() if k not in (*REQUIRED_KEYS, *IGNORED_KEYS, "env_mask")}
    short = next((k for k, v in extra.items() if isinstance(v, list) and len(v) < rows), None)
    if short is not None:           # TRL's reward call fails on the rows it lacks
        raise TaskError(f"rollout_func's {short}: a list of {len(extra[short])} values for {rows} rows (a column is "
                        "one value per row, or one value that is not a list for every row)")
    checked["columns"] = {k: (v[:rows] if isinstance(v, list) else [v] * rows)
                          for k, v in extra.items()}     # TRL: a list per row, else one value
    return checked


def _integers(row: Any, key: str, r: int) -> list[int]:
    """A row of token ids (or env_mask's 0/1, where True and False count) as ints; anything else (5.7, "5", True
    as an id) is one line: it would be truncated or converted into another token."""
    if not isinstance(row, (list, tuple, np.ndarray)):
        raise TaskError(f"rollout_func's {key}[{r}]: expected a list of integers, got {type(row).__name__}")
    allowed = (int, np.integer, np.bool_) if key == "env_mask" else (int, np.integer)
    for t in row:
        if not isinstance(t, allowed) or (isinstance(t, bool) and key != "env_mask"):
            raise TaskError(f"rollout_func's {key}[{r}]: {t!r} is not an integer")
    return [int(t) for t in row]
