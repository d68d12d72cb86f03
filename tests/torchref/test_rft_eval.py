"""rft-eval: accuracy and answer rate, the table and JSON, greedy determinism, and --help for every command."""

import json

import pytest

from torchref.cli import SUBCOMMANDS, main
from torchref.rft.data import make_split, write_json
from torchref.rft.engines import Generated
from torchref.rft.evaluate import evaluate, format_table


class FixedEngine:
    """Question i gets completion COMPLETIONS[i % 4] (with its answer filled in)."""

    COMPLETIONS = ("<answer>{a}</answer>", "<answer>{wrong}</answer>", "no tags", "<answer>about {a}</answer>")

    def __init__(self, questions):
        self.index = {q.question: i for i, q in enumerate(questions)}
        self.answer = {q.question: q.answer for q in questions}

    def generate(self, questions, n):
        texts = [self.COMPLETIONS[self.index[q] % 4].format(a=self.answer[q], wrong=2 * self.answer[q] + 7)
                 for q in questions for _ in range(n)]
        return Generated(texts, [1] * len(texts))


def test_accuracy_and_answer_rate():
    questions = make_split("valid", 8, 0)
    result = evaluate(FixedEngine(questions), questions, batch_size=3, progress=False)
    metrics = result["metrics"]
    # per 4 questions: one correct, one wrong but answered, one without tags, one unparseable ("about x")
    assert metrics == {"questions": 8, "completions": 8, "accuracy": 0.25, "answer_rate": 0.5}
    assert [r["correct"] for r in result["records"][:4]] == [True, False, False, False]
    assert [r["answered"] for r in result["records"][:4]] == [True, True, False, False]
    table = format_table(metrics)
    assert "accuracy" in table and "0.2500" in table and "answer_rate" in table


def test_samples_per_question_are_all_scored():
    questions = make_split("valid", 2, 0)
    result = evaluate(FixedEngine(questions), questions, samples=3, progress=False)
    assert result["metrics"]["completions"] == 6 and result["metrics"]["accuracy"] == 0.5


def test_eval_cli_on_tiny_model_is_greedy_and_deterministic(tiny_dir, tmp_path, capsys):
    write_json(tmp_path / "valid.json", make_split("valid", 3, 0))
    records = []
    for name in ("a", "b"):
        capsys.readouterr()
        assert main(["rft-eval", "--model", str(tiny_dir("llama")), "--questions", str(tmp_path / "valid.json"),
                     "--max-new-tokens", "6", "--json", str(tmp_path / f"{name}.json"), "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert "accuracy" in out and "answer_rate" in out
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["metrics"]["questions"] == 3 and record["metrics"]["completions"] == 3
        assert 0.0 <= record["metrics"]["accuracy"] <= record["metrics"]["answer_rate"] <= 1.0
        records.append([r["completion"] for r in record["records"]])
    assert records[0] == records[1]


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_has_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"torchref {command}" in text
