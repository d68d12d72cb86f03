"""The keyword reward, written as a user would: a TRL-style reward function.

`keywords` is a dataset column (two words per prompt), passed as a list with one item per completion.
"""

import re


def uses_keywords(prompts, completions, keywords, **kwargs):
    """The fraction of the requested words the completion uses (whole words, any case)."""
    rewards = []
    for completion, words in zip(completions, keywords):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        used = [bool(re.search(rf"\b{re.escape(word)}\b", text, re.IGNORECASE)) for word in words]
        rewards.append(sum(used) / len(words))
    return rewards
