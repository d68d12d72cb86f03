"""Unique-token training: a group's prompt runs once, its completions attend to it (prefix trees), rows packed.

The G completions of a prompt share its tokens, so a train step (and the forwards scoring old and reference
log-probs) runs a *tree* per prompt: the prompt's slots once, then each completion's slots, every completion
attending to the prompt's keys and values and to its own (`tree_visibility`), at the positions it has on its own
row. Autodiff then sums the gradient into the prompt's slots over the completions. Each completion token is scored
from the hidden state of the slot before it on its sequence (`source_BC`), so the per-token arrays the loss reads
keep the unpacked [B, C] layout and every loss option runs unchanged.

Two layouts (`pack`):

- **Trees at the bucket widths** (`grpo.token_budget` unset): a row holds a prompt's P columns and up to `tree`
  completions of C columns each, `tree` chosen by `tree_size` (the projections' work saved against the attention
  a longer row adds). The shapes follow from the widths and the group structure alone, so a run's programs are
  known (and made) ahead of its rollouts, as without packing.
- **Rows packed to a token budget** (TRL AsyncGRPO's `token_budget`: tokens per row, shared tokens counted once):
  each tree holds the prompt's real tokens and its completions at their real lengths, trees fill rows of exactly
  `token_budget` slots first-fit (a group larger than a row is split, each part with a copy of its prompt), and the
  row count rounds up to a power of two so a run meets a few shapes, not one per rollout.

Rows are laid out so that the learner's splits (optimiser steps, then gradient-accumulation micro-batches: strided)
and its data sharding (contiguous blocks) take each piece's packed rows along with its completions: packed row
r = (shard * R + j) * F + q holds the j-th row of the piece q of shard `shard` (F = steps_per_generation pieces).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.errors import UserError
from jaxcore.inference.logprobs import token_logprobs_and_entropy
from jaxcore.model.config import ModelConfig
from jaxcore.model.transformer import Transformer, positions_from_mask

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PackedTrees:
    """A rollout's tokens as prefix trees in packed rows [N, T] (see the module docstring)."""

    ids_NT: Array
    positions_NT: Array
    tree_NT: Array          # int32: the tree a slot belongs to within its row (-1: an empty or padding slot)
    branch_NT: Array        # int32: 0 on the prompt's slots, k >= 1 on the k-th completion of the tree
    # per completion token: the slot scoring it (the token before it on its sequence), as row * T + column with
    # the row counted within its shard's rows of the whole rollout (`rows_per_shard`; 0 where nothing is scored)
    source_BC: Array
    shards: int = dataclasses.field(default=1, metadata=dict(static=True))
    rows_per_shard: int = dataclasses.field(default=1, metadata=dict(static=True))


def tree_visibility(tree_NT: Array, branch_NT: Array) -> Array:
    """[N, T, T]: slot t sees slot s when both are of one tree, s is a real slot no later than t, and s is on the
    prompt or on t's own completion."""
    slot_T = jnp.arange(tree_NT.shape[1])
    same_tree_NTS = (tree_NT[:, :, None] == tree_NT[:, None, :]) & (tree_NT[:, None, :] >= 0)
    own_branch_NTS = (branch_NT[:, None, :] == 0) | (branch_NT[:, :, None] == branch_NT[:, None, :])
    return same_tree_NTS & own_branch_NTS & (slot_T[None, :] <= slot_T[:, None])[None]


def tree_logps(model: Transformer, trees: PackedTrees, targets_BC: Array, temperature: float = 1.0,
               entropy_grad: bool = False) -> tuple[Array, Array]:
    """Log-prob of every completion token and the entropy where it is scored: two [B, C], equal (to rounding) to
    the unpacked rows' `policy_logps` from the prompt's last position on. The LM head runs at the B * C scored
    positions only, each gathered within its shard's rows (no data moves between devices)."""
    hidden_NTD = model.hidden_states(trees.ids_NT, trees.positions_NT,
                                     tree_visibility(trees.tree_NT, trees.branch_NT))
    n, t, d = hidden_NTD.shape
    b, c = targets_BC.shape
    shards = trees.shards
    fold = trees.rows_per_shard // (n // shards)        # the learner's splits: a piece's rows are every fold-th
    source_BC = trees.source_BC
    local_BC = (source_BC // t // fold) * t + source_BC % t
    hidden_SXD = hidden_NTD.reshape(shards, (n // shards) * t, d)
    picked_SYD = jnp.take_along_axis(hidden_SXD, local_BC.reshape(shards, (b // shards) * c, 1), axis=1,
                                     mode="promise_in_bounds")
    logits_BCV = model.logits(picked_SYD.reshape(b, c, d))
    if temperature != 1.0:
        logits_BCV = logits_BCV / temperature
    return token_logprobs_and_entropy(logits_BCV, targets_BC, entropy_grad=entropy_grad)


# ----------------------------------------------------------------------------- choosing the layout


def tree_size(config: ModelConfig, prompt_width: int, completion_width: int, group: int) -> int:
    """Completions per tree at the bucket widths: the count (1 .. group) whose trees cost least, a tree of width
    W = P + k * C costing its tokens' projections and MLP (linear in W) plus its dense attention (W * W, the
    masked part included: XLA computes it)."""
    d, e, f = config.hidden_size, config.head_dim, config.intermediate_size
    h, kv = config.num_heads, config.num_kv_heads
    per_token = 2 * (d * e * (2 * h + 2 * kv) + 3 * d * f)       # forward FLOPs of a layer's GEMMs per token
    per_pair = 4 * h * e + 8 * h                                 # q.k, p.v and the softmax per (query, key)

    def cost(k: int) -> float:
        width = prompt_width + k * completion_width
        return math.ceil(group / k) * (per_token * width + per_pair * width * width)

    return min(range(1, max(group, 1) + 1), key=lambda k: (cost(k), -k))


def pack(prompt_ids_BP: Any, prompt_mask_BP: Any, completion_ids_BC: Any, completion_mask_BC: Any, *,
         pieces: int = 1, shards: int = 1, tree: int | Callable[[int], int] = 1, token_budget: int | None = None,
         share_prompts: bool = True, group: int | None = None) -> PackedTrees:
    """Host arrays of a left-padded prompt / right-padded completion batch as packed prefix trees: trees of at
    most `tree` completions (or `tree(group size)`) at the bucket widths, or (with `token_budget`) real tokens in
    rows of that many slots. Completions share a prompt where its tokens are the same (and `share_prompts`), within
    a rollout's group of `group` consecutive rows where given (so that a run's shapes follow from its settings, as
    `GRPOLearner.make_programs` expects, even where two groups draw the same prompt).
    `pieces` is the learner's steps_per_generation and `shards` its data shards (module docstring)."""
    prompt_ids_BP, prompt_mask_BP = np.asarray(prompt_ids_BP, np.int32), np.asarray(prompt_mask_BP, np.int32)
    completion_ids_BC = np.asarray(completion_ids_BC, np.int32)
    completion_mask_BC = np.asarray(completion_mask_BC, np.int32)
    b, p = prompt_ids_BP.shape
    c = completion_ids_BC.shape[1]
    if b % (pieces * shards):
        raise ValueError(f"batch of {b} does not split into {pieces} micro-batches over {shards} devices")
    positions_BT = np.asarray(positions_from_mask(np.concatenate([prompt_mask_BP, completion_mask_BC], 1)))
    budgeted = token_budget is not None
    last_B = np.array([_last_real(row) for row in completion_mask_BC])   # completion columns placed (budget)
    first_B = np.array([min(_first_real(row), p - 1) for row in prompt_mask_BP])

    def prompt_columns(row: int) -> range:
        return range(first_B[row], p) if budgeted else range(p)

    def completion_columns(row: int) -> range:
        return range(last_B[row]) if budgeted else range(c)

    unit_rows: list[list[list[list[int]]]] = []      # per unit, its packed rows, each a list of trees (row lists)
    for rows in _units(b, pieces, shards):
        groups: dict[bytes, list[int]] = {}
        for row in rows:
            key = ((prompt_ids_BP[row] * prompt_mask_BP[row]).tobytes() + prompt_mask_BP[row].tobytes()
                   + (row // group if group else 0).to_bytes(8, "little") if share_prompts
                   else row.to_bytes(8, "little"))
            groups.setdefault(key, []).append(row)
        trees = []
        for members in groups.values():
            trees += _split_group(members, tree, token_budget, prompt_columns, completion_columns)
        unit_rows.append(_fill_rows(trees, token_budget, prompt_columns, completion_columns))
    if budgeted:
        width = token_budget
        rows_per_unit = 1 << max(max(len(r) for r in unit_rows) - 1, 0).bit_length()
    else:
        width = p + max(len(t) for rows in unit_rows for row in rows for t in row) * c
        rows_per_unit = max(len(r) for r in unit_rows)
    n = rows_per_unit * pieces * shards
    ids_NT = np.zeros((n, width), np.int32)
    positions_NT = np.zeros((n, width), np.int32)
    tree_NT = np.full((n, width), -1, np.int32)
    branch_NT = np.zeros((n, width), np.int32)
    source_BC = np.zeros((b, c), np.int32)
    for u, rows in enumerate(unit_rows):
        shard, piece = divmod(u, pieces)
        for j, trees in enumerate(rows):
            packed = (shard * rows_per_unit + j) * pieces + piece
            local = packed - shard * rows_per_unit * pieces             # the row within its shard's rows
            slots_NT, column = (ids_NT, positions_NT, tree_NT, branch_NT), 0
            for tree_id, members in enumerate(trees):
                first = members[0]
                column = _place(slots_NT, packed, column, prompt_columns(first), prompt_mask_BP[first],
                                (prompt_ids_BP[first], positions_BT[first, :p], tree_id, 0))
                last_prompt = column - 1                        # the slot of the prompt's last column
                for k, row in enumerate(members, start=1):
                    cols, start = completion_columns(row), column
                    column = _place(slots_NT, packed, column, cols, completion_mask_BC[row],
                                    (completion_ids_BC[row], positions_BT[row, p:], tree_id, k))
                    # each token is scored from the slot before it: the prompt's last, then its own previous
                    previous = np.concatenate([[last_prompt], start + np.arange(len(cols) - 1)])[:len(cols)]
                    source_BC[row, :len(cols)] = local * width + previous
    return PackedTrees(ids_NT, positions_NT, tree_NT, branch_NT, source_BC, shards=shards,
                       rows_per_shard=rows_per_unit * pieces)


def _place(slots_NT: tuple[np.ndarray, ...], packed: int, column: int, cols: range, mask: np.ndarray,
           values: tuple[Any, ...]) -> int:
    """Columns `cols` of one sequence into packed row `packed` from slot `column` on: each of `slots_NT` (ids,
    positions, tree, branch) takes its value (a row of the sequence's, or one number) where the column is real (its
    padding stays empty); returns the next free slot."""
    real = mask[cols.start:cols.stop].astype(bool)
    slots = slice(column, column + len(cols))
    for array_NT, value in zip(slots_NT, values, strict=True):
        taken = value[cols.start:cols.stop] if isinstance(value, np.ndarray) else value
        array_NT[packed, slots] = np.where(real, taken, array_NT[packed, slots])
    return column + len(cols)


def _units(rows: int, pieces: int, shards: int) -> list[list[int]]:
    """The batch rows of each piece and shard, unit shard * pieces + piece: rows i * pieces + piece over the shard's
    contiguous block of i (the learner's strided splits of its data-sharded batch)."""
    per_unit = rows // (pieces * shards)
    return [[i * pieces + piece for i in range(shard * per_unit, (shard + 1) * per_unit)]
            for shard in range(shards) for piece in range(pieces)]


def _first_real(mask_P: np.ndarray) -> int:
    real = np.flatnonzero(mask_P)
    return int(real[0]) if real.size else len(mask_P)


def _last_real(mask_C: np.ndarray) -> int:
    """The completion's columns up to its last real token."""
    real = np.flatnonzero(mask_C)
    return int(real[-1]) + 1 if real.size else 0


def _split_group(members: list[int], tree: int | Callable[[int], int], token_budget: int | None,
                 prompt_columns: Any, completion_columns: Any) -> list[list[int]]:
    """A prompt's completions as trees: `tree` at a time, or as many as fit the budget with the prompt."""
    if token_budget is None:
        size = tree(len(members)) if callable(tree) else tree
        return [members[i:i + size] for i in range(0, len(members), size)]
    prompt = len(prompt_columns(members[0]))
    trees: list[list[int]] = []
    used = 0
    for row in members:
        need = len(completion_columns(row))
        if prompt + need > token_budget:
            raise UserError(f"grpo.token_budget={token_budget} is below a prompt and its completion "
                            f"({prompt + need} tokens): raise it to at least the prompt plus "
                            "rollout.max_new_tokens")
        if not trees or used + need > token_budget:       # the group's first tree, or the last one is full
            trees.append([])
            used = prompt
        trees[-1].append(row)
        used += need
    return trees


def _fill_rows(trees: list[list[int]], token_budget: int | None, prompt_columns: Any,
               completion_columns: Any) -> list[list[list[int]]]:
    """Trees into rows: one each at the bucket widths; first-fit into rows of the budget."""
    if token_budget is None:
        return [[t] for t in trees]
    rows: list[list[list[int]]] = []
    free: list[int] = []
    for t in trees:
        size = len(prompt_columns(t[0])) + sum(len(completion_columns(r)) for r in t)
        fit = next((i for i, room in enumerate(free) if room >= size), None)
        if fit is None:
            rows.append([])
            free.append(token_budget)
            fit = len(rows) - 1
        rows[fit].append(t)
        free[fit] -= size
    return rows


def planned_shape(config: ModelConfig, rows: int, group: int, pieces: int, shards: int, prompt_width: int,
                  completion_width: int, token_budget: int | None = None) -> tuple[int, int]:
    """(packed rows per piece and shard, slots per row) that `pack` makes of `rows` full-length completions whose
    prompts repeat in runs of `group` (a rollout's layout), without the tokens: what the memory plan counts."""
    largest_rows, largest_width = 0, 0
    for unit in _units(rows, pieces, shards):
        members: dict[int, int] = {}
        for row in unit:
            members[row // group] = members.get(row // group, 0) + 1
        if token_budget is None:
            sizes = [tree_size(config, prompt_width, completion_width, m) for m in members.values()]
            unit_rows = sum(math.ceil(m / k) for m, k in zip(members.values(), sizes, strict=True))
            width = prompt_width + max(min(k, m) for m, k in zip(members.values(), sizes, strict=True)) * (
                completion_width)
        else:
            per_tree = max((token_budget - prompt_width) // completion_width, 1)
            trees = sum(math.ceil(m / per_tree) for m in members.values())
            unique = trees * prompt_width + len(unit) * completion_width
            unit_rows, width = 1 << max(math.ceil(unique / token_budget) - 1, 0).bit_length(), token_budget
        largest_rows, largest_width = max(largest_rows, unit_rows), max(largest_width, width)
    return largest_rows, largest_width
