"""Load ``Example`` records from JSON, JSONL or a local HF ``datasets`` directory.

Accepted records: ``{"prompt": ..., "answer": ..., <more columns>}`` objects (key names
configurable; every column is kept for reward functions; the answer is optional unless
``require_answer``) or ``[prompt, answer]`` pairs (the RFT format). A prompt is a string or a
conversation (a list of ``{"role", "content"}`` messages, TRL's conversational format).
``*.jsonl`` files hold one record per line
(blank lines are skipped); any other file is one JSON list; a directory is loaded with
``datasets.load_from_disk``. Every problem raises a one-line :class:`TaskError` naming the
file and the line, record or row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxcore.errors import UserError, check_text
from jaxcore.rewards.types import Example, TaskError


def load_records(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    hf_split: str = "train",
    require_answer: bool = True,
) -> list[Example]:
    """All records of ``path`` as examples; ``hf_split`` picks a split of a DatasetDict."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"{path}: file not found")
    if path.is_dir():
        items = _hf_rows(path, prompt_key, answer_key if require_answer else None, hf_split)
    elif not path.is_file():            # a device or a named pipe: reading it would not end, or block
        raise TaskError(f"{path}: not a regular file (a device or a pipe); give a JSON or JSONL file or a dataset "
                        "directory")
    else:
        text = _read_text(path)
        items = _jsonl_items(path, text) if path.suffix == ".jsonl" else _json_items(path, text)
    examples = [to_example(where, record, prompt_key, answer_key, require_answer) for where, record in items]
    if not examples:
        raise TaskError(f"{path}: no records")
    return examples


def to_example(where: str, record: Any, prompt_key: str, answer_key: str, require_answer: bool = True) -> Example:
    """Validate one record; ``where`` prefixes the error message."""
    if isinstance(record, dict):
        required = (prompt_key, answer_key) if require_answer else (prompt_key,)
        for key in required:
            if key not in record:
                raise TaskError(f"{where}: missing field '{key}'")
        prompt, answer = record[prompt_key], record.get(answer_key)
        columns = {key: value for key, value in record.items() if key != prompt_key}
    elif isinstance(record, (list, tuple)):
        if len(record) != 2:
            raise TaskError(f"{where}: expected a [prompt, answer] pair, got {len(record)} items")
        prompt, answer = record
        columns = {answer_key: answer}
    else:
        raise TaskError(
            f"{where}: expected an object with '{prompt_key}' and '{answer_key}' or a "
            f"[prompt, answer] pair, got {type(record).__name__}"
        )
    check_prompt(where, prompt_key, prompt)
    if answer is None and require_answer:
        raise TaskError(f"{where}: field '{answer_key}' is null")
    return Example(prompt=prompt, answer=answer, columns=columns)


def check_prompt(where: str, key: str, prompt: Any) -> None:
    """A prompt is a non-empty string or a non-empty list of {"role": str, "content": str} messages."""
    if isinstance(prompt, list):
        if not prompt:
            raise TaskError(f"{where}: field '{key}' is an empty conversation")
        for index, message in enumerate(prompt):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise TaskError(f"{where}: field '{key}' message [{index}] needs string 'role' and 'content'")
            _check_text(message["content"], f"{where}: field '{key}' message [{index}]")
        return
    if not isinstance(prompt, str):
        raise TaskError(
            f"{where}: field '{key}' must be a string or a list of messages, got {type(prompt).__name__}"
        )
    if not prompt:
        raise TaskError(f"{where}: field '{key}' is empty")
    _check_text(prompt, f"{where}: field '{key}'")


def _check_text(value: str, where: str) -> None:
    try:
        check_text(value, where)
    except UserError as err:
        raise TaskError(str(err)) from None


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read file ({e})") from e
    if not text.strip():
        raise TaskError(f"{path}: file is empty")
    return text


DATASET_JSON = ("state.json", "dataset_info.json", "dataset_dict.json")   # what datasets.load_from_disk reads


def _json_object(path: Path) -> None:
    """`path` holds one JSON object (else TaskError naming the file)."""
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict):
        raise TaskError(f"{path}: must be a JSON object, got {type(data).__name__}")


def _jsonl_items(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e


def _json_items(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        hint = "; use a .jsonl suffix for one record per line" if e.msg == "Extra data" else ""
        raise TaskError(f"{path}:{e.lineno}: invalid JSON ({e.msg}{hint})") from e
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for index, record in enumerate(data):
        yield f"{path}: record [{index}]", record


def _hf_rows(
    path: Path, prompt_key: str, answer_key: str | None, hf_split: str
) -> Iterator[tuple[str, Any]]:
    from datasets import DatasetDict, load_from_disk  # slow import, only for directories

    for name in DATASET_JSON:
        if (path / name).is_file():
            _json_object(path / name)
    try:
        data = load_from_disk(str(path))
    except FileNotFoundError as e:
        raise TaskError(f"{path}: not a dataset saved with datasets.save_to_disk") from e
    except Exception as e:      # datasets/pyarrow raise many types for a damaged directory; it is the user's input
        files = " / ".join(name for name in DATASET_JSON if (path / name).is_file()) or "its files"
        raise TaskError(f"{path}: cannot load the saved dataset from {files} or its data files "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from e
    if isinstance(data, DatasetDict):
        if hf_split not in data:
            raise TaskError(f"{path}: no split '{hf_split}' (splits: {', '.join(data)})")
        data = data[hf_split]
    for key in (prompt_key, answer_key):
        if key is not None and key not in data.column_names:
            raise TaskError(
                f"{path}: column '{key}' not found (columns: {', '.join(data.column_names)})"
            )
    for index, row in enumerate(data):
        yield f"{path}: row {index}", dict(row)
