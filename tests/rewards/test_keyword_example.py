"""The keyword example's reward (`examples/keyword/rewards.py`): words count only outside quotation marks, and an
apostrophe inside a word is no quotation mark."""

import importlib.util
from pathlib import Path

import pytest

REWARDS = Path(__file__).resolve().parents[2] / "examples" / "keyword" / "rewards.py"


@pytest.fixture(scope="module")
def uses_keywords():
    spec = importlib.util.spec_from_file_location("keyword_rewards", REWARDS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.uses_keywords


@pytest.mark.parametrize(("completion", "reward"), [
    ("The old dog sat on a red mat.", 1.0),
    ("The old dog sat on a mat.", 0.5),
    ('Use "old" and "red".', 0.0),
    ("Use 'old' and 'red'.", 0.0),
    ("Use ‘old’ and “red”.", 0.0),
    # an apostrophe in a word opened a quoted span that ran to the first quote, which left the quoted words out of
    # every span: this scored 1.0
    ('I\'ll use "old" and "red" to create', 0.0),
    ("It's an old barn with a red door's frame.", 1.0),
    ("Don't paint the old fence 'red'.", 0.5),
    ("Write the words in a sentence: old, red.", 0.0),
])
def test_words_count_outside_quotes_only(uses_keywords, completion, reward):
    assert uses_keywords(["p"], [completion], [["old", "red"]]) == [reward]
