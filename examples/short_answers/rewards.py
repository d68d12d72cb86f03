"""The short-answers reward, written as a user would: a TRL-style reward function.

TRL's signature: `fn(prompts, completions, completion_ids=..., **columns)`; `answer` is a dataset column,
passed as a list with one item per completion. Returns one float per completion.
"""

import re

MAX_WORDS = 3


def short_correct_answer(prompts, completions, answer, **kwargs):
    """1.0 for the right city in at most three words; 0.5 for the right city in a longer answer; else
    a small brevity credit (0.1 x words saved), so shorter wrong answers still point the way."""
    rewards = []
    for completion, city in zip(completions, answer):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        words = re.findall(r"[\w'-]+", text)
        correct = city.lower() in text.lower()
        if correct:
            rewards.append(1.0 if len(words) <= MAX_WORDS else 0.5)
        else:
            rewards.append(0.1 * max(0, 10 - len(words)) / 10)
    return rewards
