"""File tasks: JSON / JSONL / HF datasets loading, clear one-line errors, splits."""

import json
import re
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from jaxcore.rewards.exact_match import exact_match_reward
from jaxcore.rewards.file_tasks import FileTask, file_task
from jaxcore.rewards.records import load_records
from jaxcore.rewards.registry import get_task
from jaxcore.rewards.types import Example, TaskError

RECORDS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, records: list) -> Path:
    return write(path, "\n".join(json.dumps(r) for r in records) + "\n")


def raises_exactly(message: str) -> AbstractContextManager[pytest.ExceptionInfo[TaskError]]:
    """Expect a TaskError whose whole (one-line) message is ``message``."""
    return pytest.raises(TaskError, match=f"^{re.escape(message)}$")


def test_jsonl_objects_pairs_and_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", '{"prompt": "a", "answer": 1}\n\n["b", {"k": [2]}]\n')
    assert load_records(path) == [Example("a", 1), Example("b", {"k": [2]})]


def test_json_list(tmp_path: Path) -> None:
    path = write(tmp_path / "d.json", json.dumps([["p", "q"], {"prompt": "x", "answer": 2.5}]))
    assert load_records(path) == [Example("p", "q"), Example("x", 2.5)]


def test_custom_keys(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", [{"question": "q", "solution": "s"}])
    assert load_records(path, prompt_key="question", answer_key="solution") == [Example("q", "s")]


def test_malformed_files(tmp_path: Path) -> None:
    cases = [
        (
            write(
                tmp_path / "a.jsonl", '{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": }\n'
            ),
            "{path}:2: invalid JSON (Expecting value)",
        ),
        (
            write(tmp_path / "b.jsonl", '{"prompt": "a", "answer": 1}\n\n{"prompt": "b"}\n'),
            "{path}:3: missing field 'answer'",
        ),
        (
            write(tmp_path / "c.jsonl", '{"prompt": 5, "answer": "x"}\n'),
            "{path}:1: field 'prompt' must be a string or a list of messages, got int",
        ),
        (
            write(tmp_path / "d.jsonl", '{"prompt": "", "answer": "x"}\n'),
            "{path}:1: field 'prompt' is empty",
        ),
        (
            write(tmp_path / "e.jsonl", '{"prompt": "p", "answer": null}\n'),
            "{path}:1: field 'answer' is null",
        ),
        (
            write(tmp_path / "f.jsonl", '["p", "a", "extra"]\n'),
            "{path}:1: expected a [prompt, answer] pair, got 3 items",
        ),
        (
            write(tmp_path / "g.jsonl", '"just a string"\n'),
            "{path}:1: expected an object with 'prompt' and 'answer' or a [prompt, answer] pair, "
            "got str",
        ),
        (write(tmp_path / "h.jsonl", "  \n\n"), "{path}: file is empty"),
        (write(tmp_path / "i.json", ""), "{path}: file is empty"),
        (write(tmp_path / "j.json", "[]"), "{path}: no records"),
        (
            write(tmp_path / "k.json", '{"prompt": "p", "answer": 1}'),
            "{path}: expected a JSON list of records, got dict",
        ),
        (
            write(tmp_path / "l.json", '[{"prompt": "p", "answer": 1},\n {"answer": 2}]'),
            "{path}: record [1]: missing field 'prompt'",
        ),
        (
            write(tmp_path / "m.json", '[{"prompt": "p",\n "answer": 1,,}]'),
            "{path}:2: invalid JSON (Expecting property name enclosed in double quotes)",
        ),
        (
            write(
                tmp_path / "n.json", '{"prompt": "p", "answer": 1}\n{"prompt": "q", "answer": 2}'
            ),
            "{path}:2: invalid JSON (Extra data; use a .jsonl suffix for one record per line)",
        ),
        (tmp_path / "missing.jsonl", "{path}: file not found"),
    ]
    for path, message in cases:
        with raises_exactly(message.format(path=path)):
            load_records(path)


def test_hf_dataset_directory(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    data = Dataset.from_dict({"question": ["q1", "q2"], "solution": [1.5, 2.5]})
    data.save_to_disk(str(tmp_path / "single"))
    DatasetDict({"train": data, "test": data.select([1])}).save_to_disk(str(tmp_path / "dict"))
    options = {"prompt_key": "question", "answer_key": "solution"}

    assert load_records(tmp_path / "single", **options) == [Example("q1", 1.5), Example("q2", 2.5)]
    assert load_records(tmp_path / "dict", hf_split="test", **options) == [Example("q2", 2.5)]
    with raises_exactly(
        f"{tmp_path / 'single'}: column 'prompt' not found (columns: question, solution)"
    ):
        load_records(tmp_path / "single")
    with raises_exactly(f"{tmp_path / 'dict'}: no split 'eval' (splits: train, test)"):
        load_records(tmp_path / "dict", hf_split="eval", **options)
    (tmp_path / "not_a_dataset").mkdir()
    with raises_exactly(
        f"{tmp_path / 'not_a_dataset'}: not a dataset saved with datasets.save_to_disk"
    ):
        load_records(tmp_path / "not_a_dataset")

    task = get_task(
        "file", path=tmp_path / "dict", eval_hf_split="test", reward="numeric", **options
    )
    assert set(task.examples("train", 2, 0)) == {Example("q1", 1.5), Example("q2", 2.5)}
    assert task.examples("eval", 1, 0) == [Example("q2", 2.5)]


def test_single_file_split_is_disjoint_and_seeded(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", RECORDS)
    rewards = {"exact_match": exact_match_reward}
    task = file_task(path, rewards, {"exact_match": 1.0}, eval_fraction=0.2, split_seed=3)
    assert (task.num_examples("train"), task.num_examples("eval")) == (8, 2)
    train, evals = set(task.train), set(task.eval)
    assert not train & evals and len(train | evals) == 10
    again = file_task(path, rewards, {"exact_match": 1.0}, eval_fraction=0.2, split_seed=3)
    assert again.eval == task.eval
    other = file_task(path, rewards, {"exact_match": 1.0}, eval_fraction=0.2, split_seed=4)
    assert other.eval != task.eval
    sample = task.examples("train", 5, seed=1)
    assert sample == task.examples("train", 5, seed=1) and len(set(sample)) == 5
    assert set(task.examples("train", 8, seed=2)) == train
    with raises_exactly("file:d.jsonl: asked for 3 eval examples, only 2 exist"):
        task.examples("eval", 3, 0)
    with raises_exactly(
        f"{path}: cannot split 10 records with eval_fraction=0.01 "
        "(need at least one train and one eval record)"
    ):
        file_task(path, rewards, {"exact_match": 1.0}, eval_fraction=0.01)


def test_two_files(tmp_path: Path) -> None:
    train = jsonl(tmp_path / "train.jsonl", RECORDS[:6])
    evals = write(
        tmp_path / "eval.json", json.dumps([[r["prompt"], r["answer"]] for r in RECORDS[6:]])
    )
    task = get_task(
        "file",
        path=train,
        eval_path=evals,
        reward={"exact_match": 1.0, "digit_match": 0.5},
        reward_options={"digit_match": {"align": "left"}},
        name="sums",
    )
    assert isinstance(task, FileTask) and task.name == "sums"
    assert task.reward_weights == {"exact_match": 1.0, "digit_match": 0.5}
    assert task.reward_fns["digit_match"](["1"], [Example("p", "12")]) == [0.5]
    assert task.num_examples("train") == 6 and task.num_examples("eval") == 4
    with raises_exactly(f"{tmp_path / 'nope.json'}: file not found"):
        get_task("file", path=train, eval_path=tmp_path / "nope.json")


CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Capital of Peru?"}]
ROWS = [
    {"prompt": "Capital of France?", "answer": "Paris", "max_words": 1, "tags": ["geo", "eu"], "meta": {"id": 7}},
    {"prompt": CHAT, "answer": "Lima", "max_words": None, "tags": [], "meta": {"id": 8}},
]


def columns_of(examples: list[Example]) -> list[dict]:
    """Example equality ignores columns: compare them explicitly."""
    return [dict(e.columns) for e in examples]


@pytest.mark.parametrize("kind", ["json", "jsonl"])
def test_json_and_jsonl_keep_every_column(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"d.{kind}"
    if kind == "json":
        write(path, json.dumps(ROWS))
    else:
        jsonl(path, ROWS)
    examples = load_records(path)
    assert [(e.prompt, e.answer) for e in examples] == [(r["prompt"], r["answer"]) for r in ROWS]
    assert columns_of(examples) == [{k: v for k, v in r.items() if k != "prompt"} for r in ROWS]
    partial = jsonl(tmp_path / "partial.jsonl", [{"prompt": "a", "hint": "h"}, {"prompt": "b"}])
    assert columns_of(load_records(partial, require_answer=False)) == [{"hint": "h"}, {}]


def test_hf_directory_keeps_every_column_and_conversations(tmp_path: Path) -> None:
    from datasets import Dataset

    # An Arrow column has one type: every prompt of this directory is a conversation (TRL's format).
    rows = [{**ROWS[0], "prompt": [{"role": "user", "content": "Capital of France?"}]}, ROWS[1]]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    examples = load_records(tmp_path / "hf")
    assert [e.prompt for e in examples] == [r["prompt"] for r in rows]     # conversations survive Arrow
    assert [e.answer for e in examples] == ["Paris", "Lima"]
    expected = [{k: v for k, v in r.items() if k != "prompt"} for r in rows]
    assert columns_of(examples) == expected
    task = get_task("file", path=tmp_path / "hf", eval_fraction=0.5)      # through the task, too
    assert sorted(map(repr, columns_of([*task.train, *task.eval]))) == sorted(map(repr, expected))


@pytest.mark.parametrize("kind", ["pipe", "device"])
def test_a_dataset_path_that_is_a_pipe_or_a_device_is_one_line(tmp_path, kind):
    """(Before: a named pipe with no writer blocked the run forever; /dev/zero was read until memory ran out.)"""
    import os
    import threading

    if kind == "pipe":
        path = tmp_path / "data.jsonl"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    raised: list[BaseException] = []

    def load() -> None:
        try:
            load_records(path)
        except BaseException as err:  # noqa: BLE001
            raised.append(err)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "load_records did not return"
    assert isinstance(raised[0], TaskError) and "not a regular file" in str(raised[0])
