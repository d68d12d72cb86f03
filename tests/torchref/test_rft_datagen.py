"""Rejection-sampling datagen: the filter, the batching, the knobs, and real runs on a tiny model."""

import json
import shutil

import pytest
from cli_runs import run_datagen

import torchref.rft.datagen as datagen
from torchref.cli import main
from torchref.rft.data import load_sft, make_split, write_json
from torchref.rft.datagen import DatagenConfig, generate_dataset
from torchref.rft.engines import Generated, SamplingParams, load_engine, sample_batched
from torchref.rft.errors import RFTError
from torchref.rft.grading import correct
from torchref.rft.settings import resolve_knobs


class ScriptedEngine:
    """Returns known completions: sample j of a question is SCRIPT[j % 4] filled with its answer."""

    SCRIPT = (
        "Think. <answer>{right}</answer>",                  # correct
        "Think harder. <answer>{wrong}</answer>",            # 2x off: wrong
        "I do not know.",                                    # no answer at all
        "Close: <answer>{close} units</answer> and chatter",  # within 5%: correct, chatter trimmed
    )

    def __init__(self, answers, unsolvable=()):
        self.answers, self.unsolvable = answers, set(unsolvable)
        self.calls, self.counter = [], {}

    def generate(self, questions, num_return_sequences):
        self.calls.append((len(questions), num_return_sequences))
        texts = []
        for q in questions:
            for _ in range(num_return_sequences):
                j = self.counter.get(q, 0)
                self.counter[q] = j + 1
                a = self.answers[q]
                template = self.SCRIPT[1] if q in self.unsolvable else self.SCRIPT[j % 4]
                texts.append(template.format(right=a, wrong=2 * a + 1, close=a * 1.04))
        return Generated(texts, [len(t) for t in texts])


@pytest.fixture
def questions():
    return make_split("train", 5, 0)


def test_filter_keeps_only_correct_samples(questions, tmp_path):
    engine = ScriptedEngine({q.question: q.answer for q in questions}, unsolvable=[questions[2].question])
    entries, stats = generate_dataset(engine, questions, DatagenConfig(oversample=8, keep=0), progress=False)
    # Every solvable question keeps its two distinct correct forms; the unsolvable one keeps nothing.
    assert len(entries) == 2 * 4
    assert {e.question for e in entries} == {q.question for q in questions} - {questions[2].question}
    for e in entries:
        assert correct(e.reasoning, e.answer)
        assert e.reasoning.endswith("</answer>")        # trailing chatter after the answer is dropped
    assert (stats.questions, stats.solved, stats.completions) == (5, 4, 40)
    assert stats.correct == 4 * 4 and stats.answered == 4 * 6 + 8
    assert stats.success_rate == pytest.approx(0.8)
    write_json(tmp_path / "rft.json", entries)
    raw = json.loads((tmp_path / "rft.json").read_text())
    assert all(isinstance(q, str) and isinstance(a, float) and isinstance(r, str) for q, a, r in raw)
    assert load_sft(tmp_path / "rft.json") == entries


def test_keep_limits_entries_per_question(questions):
    engine = ScriptedEngine({q.question: q.answer for q in questions})
    entries, stats = generate_dataset(engine, questions, DatagenConfig(oversample=8, keep=1), progress=False)
    assert [e.question for e in entries] == [q.question for q in questions]
    assert all(e.reasoning == f"Think. <answer>{e.answer}</answer>" for e in entries)
    assert stats.kept == 5


def test_batching_respects_micro_batch_and_chunk_sizes(questions):
    engine = ScriptedEngine({q.question: q.answer for q in questions})
    config = DatagenConfig(oversample=10, batch_size=3, micro_batch_size=8, chunk_size=4)
    _, stats = generate_dataset(engine, questions, config, progress=False)
    assert stats.completions == 50
    assert all(rows * n <= 8 and n <= 4 for rows, n in engine.calls)
    assert sorted({n for _, n in engine.calls}) == [2, 4]            # 10 = 4 + 4 + 2
    assert sum(rows * n for rows, n in engine.calls) == 50
    assert max(rows for rows, _ in engine.calls) == 3                 # several questions per call
    assert all(count == 10 for count in engine.counter.values())


def test_sample_batched_keeps_rows_question_major():
    engine = ScriptedEngine({"a": 1.0, "b": 2.0, "c": 3.0})
    out = sample_batched(engine, ["a", "b", "c"], 3, micro_batch_size=4, chunk_size=2)
    for generated, answer in zip(out, (1.0, 2.0, 3.0)):
        assert len(generated.texts) == 3
        assert generated.texts[0] == f"Think. <answer>{answer}</answer>"


def test_knobs_flag_over_env_over_default():
    class Args:
        oversample = 4
        batch_size = micro_batch_size = chunk_size = temperature = max_new_tokens = None

    values = resolve_knobs(Args, datagen.KNOBS, {"RFT_OVERSAMPLE": "99", "RFT_MICRO_BATCH_SIZE": "256",
                                                 "RFT_TEMPERATURE": "0.5"})
    assert values == {"oversample": 4, "batch_size": 8, "micro_batch_size": 256, "chunk_size": 8,
                      "temperature": 0.5, "max_new_tokens": 256}
    with pytest.raises(RFTError, match="RFT_CHUNK_SIZE='ten'"):
        resolve_knobs(Args, datagen.KNOBS, {"RFT_CHUNK_SIZE": "ten"})


@pytest.mark.parametrize("engine", ["hf", "jax"])
def test_end_to_end_on_tiny_model(tiny_dir, tmp_path, capsys, engine):
    """A random tiny model: the run completes and writes a (likely empty) list plus its statistics."""
    write_json(tmp_path / "q.json", make_split("train", 4, 0))
    code, out, _ = run_datagen(capsys, tiny_dir("llama"), tmp_path / "q.json", tmp_path / "rft.json",
                               "--engine", engine, "--stats", tmp_path / "stats.json")
    assert code == 0, out
    assert isinstance(json.loads((tmp_path / "rft.json").read_text()), list)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["questions"] == 4 and stats["completions"] == 12 and 0 < stats["tokens"] <= 12 * 8
    assert stats["engine"] == engine and 0.0 <= stats["success_rate"] <= 1.0
    assert "questions solved" in out


@pytest.mark.parametrize("engine", ["hf", "jax"])
def test_real_engine_output_format(tiny_dir, monkeypatch, engine):
    """With every sample graded correct, both engines' real completions become [question, answer, reasoning]."""
    monkeypatch.setattr(datagen, "correct", lambda text, answer: True)
    questions = make_split("valid", 3, 0)
    eng = load_engine(engine, tiny_dir("llama"), SamplingParams(max_new_tokens=6, temperature=1.0))
    entries, stats = generate_dataset(eng, questions, DatagenConfig(oversample=2, batch_size=2), progress=False)
    assert stats.completions == 6 and stats.kept == 3
    for entry, question in zip(entries, questions):
        assert entry.question == question.question and entry.answer == question.answer
        assert isinstance(entry.reasoning, str)


def test_temperature_zero_is_refused(tmp_path, capsys):
    write_json(tmp_path / "q.json", make_split("train", 1, 0))
    code, _, err = run_datagen(capsys, tmp_path, tmp_path / "q.json", tmp_path / "o.json", "--temperature", "0")
    assert code == 2 and len(err) == 1 and "temperature > 0" in err[0]


@pytest.mark.parametrize("engine", ["hf", "jax"])
def test_model_without_tokenizer_fails_with_one_line(tiny_dir, tmp_path, capsys, engine):
    model = shutil.copytree(tiny_dir("llama"), tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    write_json(tmp_path / "q.json", make_split("train", 1, 0))
    code, _, err = run_datagen(capsys, model, tmp_path / "q.json", tmp_path / "o.json", "--engine", engine)
    assert code == 2
    assert len(err) == 1 and "no tokenizer files" in err[0] and str(model) in err[0], err
    capsys.readouterr()
    assert main(["rft-eval", "--model", str(model), "--questions", str(tmp_path / "q.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tokenizer files" in err[0], err
    write_json(tmp_path / "sft.json", [("Convert 1 m to cm.", 100.0, "<answer>100</answer>")])
    assert main(["rft-train", "--model", str(model), "--data", str(tmp_path / "sft.json"),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tokenizer files" in err[0], err
