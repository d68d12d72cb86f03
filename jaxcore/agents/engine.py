"""The multi-turn rollout both trainers share, with TRL's semantics (`GRPOTrainer._tool_call_loop`).

Every row is one episode with its own environment instance (if any). All rows generate a turn together; a turn
that calls tools gets their results appended as `tool` messages (the chat template's rendering of them, and the
next assistant header: the token ids TRL's `_get_tool_suffix_ids` gives) and generates again, up to
`max_tool_calling_iterations` rounds of calls; a row whose episode is over waits (it emits EOS at once) while the
others go on. The batch keeps its rows in place, so an ES population's member blocks stay intact.

Each row's KV cache is kept across turns (`reuse_cache`): the appended tokens (a turn's last uncached token, the
tool results) are written after the cache's filled slots with per-row positions, and the slots a waiting row or a
shorter chunk leaves are marked invalid, so nothing is prefilled twice. When the cache runs out of slots it is
rebuilt by one prefill of every row's whole sequence. With `reuse_cache=False` every turn re-prefills the whole
conversation instead (the simple way, kept for the measurement in docs/examples.md).

The completion of an episode is everything after the prompt: the generated tokens (`model_mask` 1) and the tokens
the model did not generate (tool results, headers: `model_mask` 0, TRL's `tool_mask`, out of GRPO's loss and
log-probs). `rollout.max_episode_tokens` bounds the completion: a turn is cut there, and tool results that would
pass it are dropped and end the episode (TRL's rollback), counted as `episodes/hit_token_limit`. Reward functions get
the completion as TRL's message list, `[assistant, tool, ..., assistant]` (`jaxcore.agents.messages`).

Over several processes every process generates every row (one global batch), but each runs the environments and
tools of its own rows only: the rows it owns (`parallel.rows.owned_rows`, the rows its reward functions score),
whose instances it alone builds and resets. What those produce is exchanged as token ids (`_share`: the prompts
with their reset text, then every turn's tool results and how each row's turn ended), so that every process
appends the same tokens and runs the same next turn.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcore.agents.agent import Agent, observed_prompt
from jaxcore.agents.calls import call_in_thread
from jaxcore.agents.environments import reset_kwargs
from jaxcore.agents.episodes import Episodes, left_pad
from jaxcore.agents.messages import assistant_message, turn_calls
from jaxcore.agents.rollout_function import RolloutFunction
from jaxcore.errors import PromptLengthError
from jaxcore.hf.tokenization import PromptLimit, limit_prompts
from jaxcore.inference.generate import (
    GenerationResult,
    bucket_length,
    decode,
    in_compute_dtype,
    place_rows,
    prefill,
    prompt_bucket,
)
from jaxcore.inference.sampling import seen_tokens
from jaxcore.model.transformer import KVCache
from jaxcore.parallel.rows import allgather_sum, gather_rows, owned_rows
from jaxcore.rewards.types import Example
from jaxcore.rewards.workers import one_line

log = logging.getLogger(__name__)
CHUNK_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024)     # tool-result chunks appended to the cache


# ----------------------------------------------------------------------------------------------- episodes


@functools.partial(jax.jit, donate_argnames=("cache",))
def _extend(model: nnx.Module, cache: KVCache, ids_BS: jax.Array, positions_BS: jax.Array, valid_BS: jax.Array,
            index: jax.Array) -> tuple[jax.Array, KVCache]:
    """Write a chunk of appended tokens after the cache's filled slots; the logits after each row's last one."""
    logits_B1V, cache = model.forward_cached(ids_BS, positions_BS, valid_BS, cache, index, last_only=True)
    return logits_B1V[:, 0], cache


def owned_row_mask(b: int, row_sharding: Any) -> np.ndarray:
    """Which of `b` rows placed with `row_sharding` this process runs the tools and environments of: the rows it
    owns (`owned_rows`: a row held by several processes is the lowest one's), those its reward functions score.
    In a single process, every row."""
    owned_B = np.zeros(b, bool)
    if jax.process_count() == 1:
        owned_B[:] = True
    else:
        owned_B[owned_rows(place_rows(np.zeros(b, np.int32), row_sharding))[0]] = True
    return owned_B


def _share(rows: list[list[int]], owned_B: np.ndarray) -> list[list[int]]:
    """Every row's token ids on every process, each row's as the process that owns it made them (the others hold
    anything there): the lengths summed over processes, then the ids padded to the longest."""
    if jax.process_count() == 1:
        return rows
    lengths_B = allgather_sum(np.array([len(r) if o else 0 for r, o in zip(rows, owned_B)], np.int32))
    ids_BW = np.zeros((len(rows), int(lengths_B.max(initial=0))), np.int32)
    for r in np.flatnonzero(owned_B):
        ids_BW[r, :len(rows[r])] = rows[r]
    if ids_BW.size:
        ids_BW = allgather_sum(ids_BW)
    return [ids_BW[r, :n].tolist() for r, n in enumerate(lengths_B)]


def run_episodes(agent: Agent, model: Any, tokenizer: Any, examples: Sequence[Example], rollout: Any, *,
                 key: jax.Array | None, eos_token_ids: Sequence[int], pad_token_id: int, row_sharding: Any = None,
                 reuse_cache: bool = True) -> Episodes:
    """Roll out one episode per row of `examples` (rows already repeated per generation / member); with `key`
    None greedily. `rollout` gives the sampling settings, `max_new_tokens` (per turn), the prompt limits and
    `system_prompt`. Each process runs the environments and tools of its own rows (`owned_row_mask`). A
    `RolloutFunction` (TRL's rollout_func) makes the episodes itself."""
    if isinstance(agent, RolloutFunction):
        return agent.episodes(model, tokenizer, examples, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids,
                              row_sharding=row_sharding)
    b, per_turn, budget = len(examples), rollout.max_new_tokens, agent.max_episode_tokens
    envs = agent.environments
    owned_B = owned_row_mask(b, row_sharding)
    instances = envs.instances(examples, owned_B) if envs is not None else [None] * b
    texts = {}
    reward_prompts = [e.prompt for e in examples]
    broken_B = np.zeros(b, bool)            # the row's environment could not be built or reset: its episode fails
    for r in np.flatnonzero(owned_B):
        example, observation = examples[r], None
        if envs is not None:
            observation, broken_B[r] = _reset(agent, instances[r], example, r)
            instances[r] = None if broken_B[r] else instances[r]
        texts[r] = agent.prompt_text(tokenizer, example, observation, instances[r], rollout.system_prompt)
        reward_prompts[r] = observed_prompt(example.prompt, observation)
    if jax.process_count() > 1:
        broken_B = allgather_sum(broken_B.astype(np.int32)) > 0
    encoded: list[list[int]] = [[] for _ in range(b)]
    if texts:
        for r, ids in zip(texts, tokenizer(list(texts.values()), add_special_tokens=False)["input_ids"]):
            encoded[r] = list(ids)
    encoded = _share(encoded, owned_B)
    limit = PromptLimit(model.config.max_position_embeddings, rollout.max_prompt_length, rollout.truncate_prompts)
    if budget >= limit.max_positions:
        raise PromptLengthError(f"rollout.max_episode_tokens {budget} leaves no room for a prompt in the model's "
                                f"{limit.max_positions} positions")
    ids_BT, mask_BT = left_pad(encoded, prompt_bucket(max(len(x) for x in encoded)), pad_token_id)
    ids_BT, mask_BT, truncated = limit_prompts(ids_BT, mask_BT, limit, budget)
    prompts = [row[m.astype(bool)].tolist() for row, m in zip(ids_BT, mask_BT)]

    sampling = rollout.sampling(greedy=key is None)
    key = key if key is not None else jax.random.key(0)
    eos = tuple(int(e) for e in eos_token_ids)
    place = functools.partial(place_rows, row_sharding=row_sharding)     # host arrays where the rows live
    model = in_compute_dtype(model)

    completion: list[list[int]] = [[] for _ in range(b)]
    from_model: list[list[int]] = [[] for _ in range(b)]
    messages: list[list[dict[str, Any]]] = [[] for _ in range(b)]
    schemas = [agent.schemas(inst) for inst in instances]     # another process's rows: the standalone tools'

    logprobs: list[list[float]] = [[] for _ in range(b)]
    active = ~broken_B                      # a broken row waits from the start: an empty completion
    ended_with_eos = np.zeros(b, bool)
    calls_B, failures_B, turns_B = (np.zeros(b, np.int64) for _ in range(3))
    rounds_B, hit_limit_B, abandoned = np.zeros(b, np.int64), np.zeros(b, bool), broken_B.copy()
    forced_eos_V = np.full(model.config.vocab_size, -1e9, np.float32)
    forced_eos_V[eos[0] if eos else pad_token_id] = 0.0

    def prefill_all(extra_slots: int) -> tuple[jax.Array, KVCache, int]:
        """One prefill of every row's whole sequence so far; returns logits, a cache with `extra_slots` free
        slots after it, and the first free slot."""
        width = prompt_bucket(max(len(p) + len(c) for p, c in zip(prompts, completion)))
        ids, mask = left_pad([p + c for p, c in zip(prompts, completion)], width, pad_token_id)
        logits, cache = prefill(model, place(ids), place(mask), cache_length=width + extra_slots)
        return logits, cache, width

    # a cache sized for the prompt and the whole episode, plus one turn of slots that waiting rows leave empty
    logits_BV, cache, index = prefill_all(budget + per_turn if reuse_cache else per_turn)
    for turn in range(budget):          # every turn adds a token to some row: the budget bounds the turns
        logits_BV = jnp.where(place(active[:, None]), logits_BV, forced_eos_V)     # waiting rows: EOS at once
        positions_B = np.array([len(p) + len(c) for p, c in zip(prompts, completion)], np.int32)
        seen_BV = (None if sampling.repetition_penalty == 1.0 else     # the episode so far, tool results too
                   place(seen_tokens([p + c for p, c in zip(prompts, completion)], model.config.vocab_size)))
        result, cache = decode(model, cache, logits_BV, place(positions_B), jnp.int32(index),
                               jax.random.fold_in(key, turn), max_new_tokens=per_turn, sampling=sampling,
                               eos_ids=eos, pad_id=int(pad_token_id), seen_BV=seen_BV)
        tokens_BN, logp_BN = gather_rows(result.tokens), gather_rows(result.logprobs)
        lengths_B, finished_B = gather_rows(result.lengths), gather_rows(result.finished)
        steps = min(int(lengths_B.max()), per_turn - 1)        # decode steps run = slots written
        index += steps
        pending: dict[int, list[Any]] = {}
        tails: dict[int, list[int]] = {}
        for r in np.flatnonzero(active):
            n = int(lengths_B[r])
            keep = min(n, budget - len(completion[r]))
            generated = tokens_BN[r, :keep].tolist()
            message = assistant_message(tokenizer, generated, prompts[r] + completion[r], schemas[r]) \
                if generated else None              # (TRL: a turn cut to nothing adds no message)
            if owned_B[r] and message is not None:
                messages[r].append(message)
            completion[r] += generated
            from_model[r] += [1] * keep
            logprobs[r] += logp_BN[r, :keep].tolist()
            turns_B[r] += 1
            tails[r] = generated[min(n, steps):]                 # generated but not yet in the cache
            if keep < n or not finished_B[r]:
                active[r], hit_limit_B[r] = False, keep < n
                continue
            ended_with_eos[r] = True
            calls = turn_calls(tokenizer, message, generated)
            if not calls or (agent.max_iterations is not None and rounds_B[r] >= agent.max_iterations):
                active[r] = False
                continue
            pending[int(r)] = calls
        ran = _run_calls(agent, tokenizer, {r: c for r, c in pending.items() if owned_B[r]}, instances, completion,
                         budget)
        feeds = {}
        for r, outcome in _share_outcomes(ran, owned_B).items():
            calls_B[r] += outcome.calls
            failures_B[r] += outcome.failures
            if outcome.end == _Outcome.ABANDONED:
                active[r], abandoned[r] = False, True
            elif outcome.end == _Outcome.HIT_LIMIT:
                active[r], hit_limit_B[r] = False, True                  # TRL: the results are dropped
            else:
                feeds[r] = outcome.suffix
        for r, suffix in feeds.items():
            messages[r] += ran[r].messages if r in ran else []
            completion[r] += suffix
            from_model[r] += [0] * len(suffix)
            logprobs[r] += [0.0] * len(suffix)
            rounds_B[r] += 1
            ended_with_eos[r] = False
        if not feeds:
            break
        chunks = {r: tails[r] + suffix for r, suffix in feeds.items()}
        width = bucket_length(max(len(c) for c in chunks.values()), CHUNK_BUCKETS)
        if not reuse_cache or index + width + per_turn > cache.length:
            if reuse_cache:
                log.debug("multi-turn KV cache full after turn %d: prefilling every row's sequence again", turn)
            logits_BV, cache, index = prefill_all(budget + per_turn if reuse_cache else per_turn)
            continue
        ids_BS = np.full((b, width), pad_token_id, np.int32)
        valid_BS = np.zeros((b, width), np.int32)
        positions_BS = np.zeros((b, width), np.int32)
        for r, chunk in chunks.items():
            start = len(prompts[r]) + len(completion[r]) - len(chunk)
            ids_BS[r, width - len(chunk):] = chunk
            valid_BS[r, width - len(chunk):] = 1
            positions_BS[r, width - len(chunk):] = np.arange(start, start + len(chunk))
        logits_BV, cache = _extend(model, cache, place(ids_BS), place(positions_BS), place(valid_BS),
                                   jnp.int32(index))
        index += width

    if hit_limit_B.any():
        log.warning("%d of %d episodes reached rollout.max_episode_tokens=%d (a turn cut there, or tool results "
                    "dropped); raise it or lower rollout.max_tool_calling_iterations", int(hit_limit_B.sum()), b,
                    budget)
    classes = [envs.classes[envs.name_of(e)] if envs is not None and owned else None
               for e, owned in zip(examples, owned_B)]
    env_rewards, env_failures = _env_rewards(agent, instances, classes, abandoned)
    env_failures = dict(zip(env_failures, allgather_sum(np.array(list(env_failures.values()), np.int64)).tolist()))
    tokens_BE = np.full((b, budget), pad_token_id, np.int32)
    logp_BE = np.zeros((b, budget), np.float32)
    model_mask_BE = np.zeros((b, budget), np.int32)
    for r in range(b):
        n = len(completion[r])
        tokens_BE[r, :n], logp_BE[r, :n], model_mask_BE[r, :n] = completion[r], logprobs[r], from_model[r]
    lengths = np.array([len(c) for c in completion], np.int32)
    result = GenerationResult(place(tokens_BE), place(logp_BE), place(lengths), place(ended_with_eos))
    prompt_ids, prompt_mask = left_pad(prompts, ids_BT.shape[1], pad_token_id)
    return Episodes(prompt_ids, prompt_mask, result, model_mask_BE, env_rewards, env_failures, calls_B,
                    failures_B, turns_B, hit_limit_B, truncated, instances if envs is not None else None, messages,
                    reward_prompts)


@dataclasses.dataclass
class _Outcome:
    """How one row's tool calls of a turn went: the calls, the failed ones, and whether the episode goes on
    (`suffix`: the token ids appended; `messages`: the tool messages they render, kept by the process that ran
    them) or ends."""

    GOES_ON, HIT_LIMIT, ABANDONED = 0, 1, 2

    calls: int
    failures: int
    end: int = GOES_ON
    suffix: list[int] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _run_calls(agent: Agent, tokenizer: Any, pending: dict[int, list[Any]], instances: list[Any],
               completion: list[list[int]], budget: int) -> dict[int, _Outcome]:
    """Run the turn's calls of every row in `pending` at once. A row whose results would pass the episode
    budget (TRL drops them), or whose environment hung (the instance is never reused), ends here."""
    order = [(r, call) for r, calls in pending.items() for call in calls]
    tools = {r: agent.tools_of(instances[r]) for r in pending}
    results = agent.runner.run([(call, tools[r]) for r, call in order])
    by_row: dict[int, list[Any]] = {r: [] for r in pending}
    for (r, _), res in zip(order, results):
        by_row[r].append(res)
    outcomes = {}
    for r, row_results in by_row.items():
        outcome = outcomes[r] = _Outcome(len(row_results), sum(not res.ok for res in row_results))
        if any(res.hung for res in row_results) and instances[r] is not None:
            agent.environments.drop(instances[r])
            outcome.end = _Outcome.ABANDONED
            continue
        outcome.messages = [{"role": "tool", "name": res.name, "content": res.content} for res in row_results]
        if agent.surely_longer(tokenizer, outcome.messages, budget - len(completion[r])):
            outcome.end, outcome.messages = _Outcome.HIT_LIMIT, []
            continue
        outcome.suffix = agent.suffix_ids(tokenizer, outcome.messages)
        if len(completion[r]) + len(outcome.suffix) > budget:
            outcome.end, outcome.suffix = _Outcome.HIT_LIMIT, []
    return outcomes


def _share_outcomes(outcomes: dict[int, _Outcome], owned_B: np.ndarray) -> dict[int, _Outcome]:
    """Every process's `_run_calls` outcomes of its own rows, on every process."""
    if jax.process_count() == 1:
        return outcomes
    b = len(owned_B)
    counts_B4 = np.zeros((b, 4), np.int32)               # ran here, calls, failures, end
    suffixes: list[list[int]] = [[] for _ in range(b)]
    for r, outcome in outcomes.items():
        counts_B4[r] = (1, outcome.calls, outcome.failures, outcome.end)
        suffixes[r] = outcome.suffix
    counts_B4 = allgather_sum(counts_B4)
    suffixes = _share(suffixes, owned_B)
    return {r: _Outcome(int(calls), int(failures), int(end), suffixes[r])
            for r, (ran, calls, failures, end) in enumerate(counts_B4) if ran}


def _reset(agent: Agent, instance: Any, example: Example, row: int) -> tuple[Any, bool]:
    """`instance.reset(**row)` under the call timeout: (its observation, whether the row's environment failed). A
    row whose instance could not be built (None) failed; an instance whose reset raised or hung is logged and never
    used again."""
    if instance is None:
        return None, True
    ok, value, _ = call_in_thread(instance.reset, reset_kwargs(example, agent.environments.named), agent.timeout_s)
    if ok:
        return value, False
    log.warning("%s.reset failed for row %d: %s; its episode fails (counted)", type(instance).__name__, row, value)
    agent.environments.drop(instance)
    return None, True


def _env_rewards(agent: Agent, instances: list[Any], classes: list[type | None], abandoned: np.ndarray
                 ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """`get_reward()` of every row's instance per environment class that defines it (NaN elsewhere; a failing or
    hanging call, an instance dropped after a hung tool or a failed reset or construction (`abandoned`), is NaN
    too, counted). `classes`: the class each of this process's rows builds (None for another process's rows)."""
    rewards, failures = {}, {}
    for name, cls in (agent.environments.reward_classes.items() if agent.environments else ()):
        values = np.full(len(instances), np.nan)
        failed = 0
        for r, inst in enumerate(instances):
            if classes[r] is not cls:
                continue
            if abandoned[r]:
                failed += 1
                continue
            ok, value, _ = call_in_thread(inst.get_reward, {}, agent.timeout_s)
            try:
                values[r] = float(value) if ok else np.nan
            except (TypeError, ValueError, OverflowError) as err:      # OverflowError: an int too large for a float
                ok, value = False, f"returned a {type(value).__name__} that is no finite number ({one_line(err)})"
            failed += not ok or not np.isfinite(values[r])
            if not ok or not np.isfinite(values[r]):
                values[r] = np.nan
                log.warning("%s.get_reward failed for row %d: %s", name, r, value)
        rewards[name], failures[name] = values, failed
    return rewards, failures

