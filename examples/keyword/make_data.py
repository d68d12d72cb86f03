"""Write train.jsonl / eval.jsonl for the keyword example: write a sentence that uses two given words.

    python examples/keyword/make_data.py            # writes next to this file

Each row: a conversational prompt and a `keywords` column (a list of two words), which the reward function receives as a
keyword argument (TRL's convention). Train and eval use disjoint keywords.
"""

import itertools
import json
import random
from pathlib import Path

TOPICS = ["the sea", "a forest", "a city", "snow", "winter", "a dog", "music", "the moon",
          "a garden", "the rain", "the sun", "a cat", "a lake", "a train", "coffee", "a river"]
KEYWORDS = ["blue", "quiet", "bright", "cold", "happy", "green", "soft", "old", "warm", "dark", "small",
            "fast", "sweet", "hot", "wild", "red", "tall", "deep", "new", "big"]


def rows(pairs: list[tuple[str, tuple[str, str]]]) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": f"Use \"{first}\" and \"{second}\" in a sentence about {topic}."}],
             "keywords": [first, second]} for topic, (first, second) in pairs]


def main() -> None:
    words = list(KEYWORDS)
    random.Random(0).shuffle(words)
    eval_words, train_words = words[:7], words[7:]
    out = Path(__file__).parent
    for name, part in (("train", train_words), ("eval", eval_words)):
        pairs = list(itertools.product(TOPICS, itertools.combinations(part, 2)))
        random.Random(1).shuffle(pairs)
        pairs = pairs[:64] if name == "eval" else pairs[:1024]
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows(pairs))
        print(f"{out / name}.jsonl: {len(pairs)} prompts")


if __name__ == "__main__":
    main()
