"""Input batches the parity tests share."""

from collections.abc import Sequence

import numpy as np


def left_padded(vocab: int, lengths: Sequence[int], seed: int = 0, dtype: type = np.int32
                ) -> tuple[np.ndarray, np.ndarray]:
    """Random token rows of the given lengths (ids 3..vocab-1), left-padded with id 0 to the longest, and
    their attention mask."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = rng.integers(3, vocab, n)
        mask[row, width - n:] = 1
    return ids, mask
