"""Fixtures shared by the GRPO tests (test_grpo_step, test_grpo_lora, test_grpo_options).

The process-wide setup (simulated devices, offline HF, `tiny_dir`) is in the repository's root conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def path(tiny_dir) -> Path:
    """The tiny llama checkpoint the GRPO tests train."""
    return tiny_dir("llama")


@pytest.fixture(scope="module")
def batch_rows() -> int:
    """Rows of `batch`; a test module overrides this fixture for another size."""
    return 8


@pytest.fixture(scope="module")
def batch(path: Path, batch_rows: int) -> Any:
    """Synthetic GRPO rollouts for `path`'s vocabulary: `batch_rows` rows of 6 prompt and 8 completion
    tokens in groups of 4 (seed 1)."""
    import jaxcore
    from jaxcore.bench.grpo import synthetic_batch

    vocab = jaxcore.load_hf(path).config.vocab_size
    return synthetic_batch(vocab, batch_rows, 6, 8, group_size=4, seed=1)
