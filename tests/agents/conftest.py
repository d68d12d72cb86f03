"""Fixtures shared by the agents tests that train end to end: a tiny GPT-2 with room for multi-turn episodes, and
a factory of its scripted copies (`counting.model_factory`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from counting import model_factory  # noqa: E402


@pytest.fixture(scope="module")
def path(tiny_dir) -> Path:
    return tiny_dir("gpt2", max_pos=4096)


@pytest.fixture(scope="module")
def make_model(path):
    return model_factory(path)
