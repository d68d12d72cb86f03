"""RFT data files: the rft-data command, the loaders, and one-line errors on malformed files."""

import json
import subprocess
import sys

import pytest

from jaxcore.rewards.tasks import unit_conversion_task
from jaxcore.rewards.types import TaskError
from torchref.cli import main
from torchref.rft.data import load_questions, load_sft, make_split, write_json
from torchref.rft.prompts import DEFAULT_TEMPLATE


def run_cli(capsys, *args):
    capsys.readouterr()
    code = main([*map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_rft_data_writes_disjoint_seeded_splits(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "rft-data", "--out", tmp_path / "a", "--train", 30, "--valid", 10, "--seed", 3)
    assert code == 0 and "train.json" in out
    train = json.loads((tmp_path / "a" / "train.json").read_text())
    valid = json.loads((tmp_path / "a" / "valid.json").read_text())
    assert len(train) == 30 and len(valid) == 10
    for question, answer in train + valid:
        assert question.startswith("Convert ") and question.endswith(".") and "<answer>" not in question
        assert isinstance(answer, float)
    assert not {q for q, _ in train} & {q for q, _ in valid}
    run_cli(capsys, "rft-data", "--out", tmp_path / "b", "--train", 30, "--valid", 10, "--seed", 3)
    assert (tmp_path / "b" / "train.json").read_text() == (tmp_path / "a" / "train.json").read_text()
    run_cli(capsys, "rft-data", "--out", tmp_path / "c", "--train", 30, "--valid", 10, "--seed", 4)
    assert (tmp_path / "c" / "train.json").read_text() != (tmp_path / "a" / "train.json").read_text()


def test_questions_come_from_the_unit_conversion_task():
    """The stored question plus the default template is exactly the task's prompt, with its answer."""
    examples = unit_conversion_task().examples("train", 5, 7)
    for (question, answer), example in zip(make_split("train", 5, 7), examples):
        assert DEFAULT_TEMPLATE.format(question=question) == example.prompt
        assert answer == example.answer


def test_loaders_round_trip(tmp_path):
    questions = make_split("valid", 4, 0)
    write_json(tmp_path / "q.json", questions)
    assert load_questions(tmp_path / "q.json") == questions
    sft = [(q, a, f"Multiply. <answer>{a}</answer>") for q, a in questions]
    write_json(tmp_path / "sft.json", sft)
    assert [tuple(e) for e in load_sft(tmp_path / "sft.json")] == sft
    assert load_questions(tmp_path / "sft.json") == questions     # reasoning is ignored for questions
    (tmp_path / "s.json").write_text(json.dumps([["Convert 1 m to cm.", "100"]]))
    assert load_questions(tmp_path / "s.json")[0].answer == 100.0


MALFORMED = {
    "invalid_json": ('[["Convert 1 m to cm.", 100.0],', "invalid JSON"),
    "not_a_list": ('{"question": "x", "answer": 1}', "expected a JSON list of entries, got dict"),
    "empty": ("[]", "no entries"),
    "entry_not_a_list": ('[["Convert 1 m to cm.", 100.0], "oops"]', "entry [1]: expected [question, answer], got str"),
    "short_entry": ('[["Convert 1 m to cm.", 100.0], ["only a question"]]', "entry [1]: expected [question, answer]"),
    "non_numeric_answer": ('[["Convert 1 m to cm.", "a lot"]]', "entry [0]: the answer must be a number"),
    "empty_question": ('[["Convert 1 m to cm.", 1.0], ["", 1.0], ["x", 2]]', "entry [1]: the question must be"),
    "nan_answer": ('[["Convert 1 m to cm.", NaN]]', "entry [0]: the answer must be finite"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_questions_file_fails_with_one_line(tmp_path, capsys, case):
    text, expected = MALFORMED[case]
    bad = tmp_path / f"{case}.json"
    bad.write_text(text)
    with pytest.raises(TaskError, match="entry|JSON|entries"):
        load_questions(bad)
    # The questions are read before the model is touched, so no model is needed to see the error.
    code, _, err = run_cli(capsys, "rft-datagen", "--model", tmp_path / "no-model", "--questions", bad,
                           "--out", tmp_path / "out.json")
    assert code == 2
    assert len(err) == 1 and expected in err[0] and str(bad) in err[0], err
    assert err[0].startswith("torchref rft-datagen: error: ")
    assert not (tmp_path / "out.json").exists()


SFT_MALFORMED = {
    "pair_not_triple": ('[["Convert 1 m to cm.", 100.0]]', "entry [0]: expected [question, answer, reasoning], "
                                                           "got 2 items"),
    "empty_reasoning": ('[["Convert 1 m to cm.", 100.0, "<answer>100</answer>"], ["q", 1.0, " "]]',
                        "entry [1]: the reasoning must be a non-empty string"),
    "missing_file": (None, "no such file"),
}


@pytest.mark.parametrize("case", sorted(SFT_MALFORMED))
def test_malformed_sft_file_fails_with_one_line(tiny_dir, tmp_path, capsys, case):
    text, expected = SFT_MALFORMED[case]
    bad = tmp_path / f"{case}.json"
    if text is not None:
        bad.write_text(text)
    code, _, err = run_cli(capsys, "rft-train", "--model", tiny_dir("llama"), "--data", bad, "--out", tmp_path / "run")
    assert code == 2
    assert len(err) == 1 and expected in err[0] and str(bad) in err[0], err


def test_malformed_file_in_a_subprocess(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[["Convert 1 m to cm.", 100.0], [42, 1.0]]')
    proc = subprocess.run([sys.executable, "-m", "torchref.cli", "rft-eval", "--model", str(tmp_path),
                           "--questions", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"torchref rft-eval: error: {bad}: entry [1]: the question must be a non-empty string"], lines
