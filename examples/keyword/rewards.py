"""The keyword reward, written as a user would: a TRL-style reward function.

`keywords` is a dataset column (two words per prompt), passed as a list with one item per completion.
A first version that only looked for the words taught the model to echo the instruction
('To use "wild" and "deep" in a sentence'), so words count only outside quotation marks and a
completion that restates the instruction earns nothing.
"""

import re

# a quotation mark: a double quote, or a single one not inside a word (the apostrophe of "I'll" opens nothing)
QUOTE_MARK = r"(?:[\"“”]|(?<!\w)['‘’]|['‘’](?!\w))"
QUOTED = re.compile(rf"{QUOTE_MARK}(?:(?!{QUOTE_MARK}).)*{QUOTE_MARK}", re.DOTALL)
RESTATES_INSTRUCTION = re.compile(r"\b(in a sentence|use the words?|sentence about)\b", re.IGNORECASE)


def uses_keywords(prompts, completions, keywords, **kwargs):
    """The fraction of the requested words the completion uses in its own words (whole words, any case,
    not inside quotes); 0 for a completion that restates the instruction."""
    rewards = []
    for completion, words in zip(completions, keywords):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        if RESTATES_INSTRUCTION.search(text):
            rewards.append(0.0)
            continue
        unquoted = QUOTED.sub(" ", text)
        used = [bool(re.search(rf"\b{re.escape(word)}\b", unquoted, re.IGNORECASE)) for word in words]
        rewards.append(sum(used) / len(words))
    return rewards
