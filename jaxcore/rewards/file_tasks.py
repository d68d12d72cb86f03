"""Tasks backed by data files (see :mod:`jaxcore.rewards.records` for the formats)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxcore.rewards.records import load_records, to_example
from jaxcore.rewards.tasks import check_split
from jaxcore.rewards.types import Example, RewardFn, TaskError


@dataclass(frozen=True)
class FileTask:
    """Fixed train and eval examples; ``examples`` samples without replacement."""

    name: str
    train: tuple[Example, ...]
    eval: tuple[Example, ...]
    reward_fns: dict[str, RewardFn]
    reward_weights: dict[str, float]

    def num_examples(self, split: str) -> int:
        """How many examples ``split`` holds."""
        check_split(split, 0)
        return len(self.train if split == "train" else self.eval)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` distinct examples of ``split`` in a ``seed``-determined order."""
        check_split(split, n)
        pool = self.train if split == "train" else self.eval
        if n > len(pool):
            raise TaskError(f"{self.name}: asked for {n} {split} examples, only {len(pool)} exist")
        return [pool[i] for i in random.Random(seed).sample(range(len(pool)), n)]


def file_task(
    path: str | Path,
    reward_fns: Mapping[str, RewardFn],
    reward_weights: Mapping[str, float],
    *,
    eval_path: str | Path | None = None,
    eval_fraction: float = 0.1,
    split_seed: int = 0,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    hf_split: str = "train",
    eval_hf_split: str | None = None,
    name: str | None = None,
    require_answer: bool = True,
) -> FileTask:
    """Load a file task.

    The eval split is ``eval_path`` (or the ``eval_hf_split`` of a DatasetDict) when given;
    otherwise ``path`` is shuffled with ``split_seed`` and ``eval_fraction`` of it
    (rounded, at least one record each side) becomes eval.
    """
    options = {"prompt_key": prompt_key, "answer_key": answer_key, "require_answer": require_answer}
    train = load_records(path, hf_split=hf_split, **options)
    if eval_path is not None or eval_hf_split is not None:
        eval_ = load_records(eval_path or path, hf_split=eval_hf_split or hf_split, **options)
    else:
        train, eval_ = split_records(path, train, eval_fraction, split_seed)
    return FileTask(
        name=name or f"file:{Path(path).name}",
        train=tuple(train),
        eval=tuple(eval_),
        reward_fns=dict(reward_fns),
        reward_weights=dict(reward_weights),
    )


def dataset_records(data: Any, name: str) -> list[Example]:
    """Examples from a path (JSON/JSONL/HF directory), a `datasets.Dataset` or a list of dicts (all columns kept)."""
    if isinstance(data, (str, Path)):
        return load_records(data, require_answer=False)
    try:
        rows = list(data)
    except TypeError:
        raise TaskError(f"{name}: expected a path, a datasets.Dataset or a list of dicts, "
                        f"got {type(data).__name__}") from None
    if not rows:
        raise TaskError(f"{name}: no records")
    return [to_example(f"{name}[{i}]", dict(row) if isinstance(row, Mapping) else row, "prompt", "answer", False)
            for i, row in enumerate(rows)]


def dataset_task(train: Any, eval_: Any, reward_fns: Mapping[str, RewardFn], reward_weights: Mapping[str, float],
                 *, eval_fraction: float = 0.1, split_seed: int = 0) -> FileTask:
    """A task over in-memory or on-disk datasets (the Python API's `train_dataset` / `eval_dataset`);
    without `eval_`, `eval_fraction` of `train` is held out. The rewards may be empty until
    `jaxcore.rewards.user_functions.task_with_rewards` sets them."""
    records = dataset_records(train, "train_dataset")
    if eval_ is None:
        records, held_out = split_records("train_dataset", records, eval_fraction, split_seed)
    else:
        held_out = dataset_records(eval_, "eval_dataset")
    return FileTask("dataset", tuple(records), tuple(held_out), dict(reward_fns), dict(reward_weights))


def split_records(
    path: str | Path, records: list[Example], eval_fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """Shuffle ``records`` with ``seed`` and cut off ``eval_fraction`` of them as eval."""
    n_eval = round(len(records) * eval_fraction)
    if not 0 < n_eval < len(records):
        raise TaskError(
            f"{path}: cannot split {len(records)} records with eval_fraction={eval_fraction} "
            "(need at least one train and one eval record)"
        )
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    return [records[i] for i in order[n_eval:]], [records[i] for i in order[:n_eval]]
