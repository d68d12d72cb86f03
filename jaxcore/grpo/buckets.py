"""The batch shapes a GRPO train step meets, and which of their programs to make ahead of time.

A rollout's train batch is cut to `prompt_width` prompt columns and `completion_width` completion columns (the
longest real ones, rounded up to a bucket), so a run makes one program per (prompt bucket, completion bucket) it
meets, never one per length, and a step pads at most a third of its prompt columns and less than half of its
completion columns. The buckets depend on the lengths alone, so a resumed or repeated run trains on exactly the
shapes (and numbers) of a straight one.

Every program a run can need for a prompt width (one per completion bucket, with the scoring forwards its options
need) is made on a background thread beside the rollout that first meets that width, the most likely first (the
completion width the last rollout had, then its neighbours), so a run makes its train-step programs while its
first rollout generates and none later for the same prompts. The bucket set itself is the cost model's answer
on the devices measured (docs/benchmarks.md): with the layers scanned a train-step program costs a fraction of a
second from the persistent cache and a few seconds cold, on the background thread, while each halving of the
bucket ratio saves padded work in every step that meets it.
"""

from __future__ import annotations

import math

import numpy as np


def completion_width(lengths_B: np.ndarray, max_new_tokens: int) -> int:
    """The completion columns a train step sees: the longest completion rounded up to a power of two (1, 2, 4,
    8, 16, ...; at most `max_new_tokens`), so a run compiles one step per bucket, not one per length. Buckets of
    1 and 2 serve collapsed completions: a step over 12 prompt columns trains 13 columns, not 16."""
    bucket = 1 << max(int(np.max(lengths_B, initial=1)) - 1, 0).bit_length()
    return min(bucket, max_new_tokens)


def completion_buckets(max_new_tokens: int) -> list[int]:
    """Every completion width a run with this limit can meet, smallest first."""
    return sorted({completion_width(np.array([n]), max_new_tokens) for n in range(1, max_new_tokens + 1)})


def prompt_width(mask_BP: np.ndarray) -> int:
    """The prompt columns a train step sees: the longest real prompt rounded up to a multiple of a quarter of
    the next power of two, at least 4 (widths 4, 8, 12, 16, 24, 32, 48, 64, 96, ...: two per doubling above
    16), so the left padding the step pays for stays small and a run compiles a handful of prompt widths."""
    longest = int(np.max(np.asarray(mask_BP).sum(-1), initial=1))
    step = max(4, (1 << max(longest - 1, 0).bit_length()) // 4)
    return -(-longest // step) * step


def likely_first(buckets: list[int], last: int) -> list[int]:
    """`buckets` in the order a rollout after one of width `last` is likely to meet them: `last` itself, then the
    others by distance in doublings (a shorter one before a longer one at the same distance)."""
    return sorted(buckets, key=lambda c: (abs(math.log2(c) - math.log2(last)), c))
