"""Prompt length limits: left truncation (warned, counted) or refusal, and max_new_tokens within positions."""

import numpy as np
import pytest

from jaxcore.cli import main
from jaxcore.hf.tokenization import PromptLengthError, PromptLimit, limit_prompts


def left_padded(lengths, width):
    ids = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = np.arange(1, n + 1)
        mask[row, width - n:] = 1
    return ids, mask


def test_long_prompts_keep_their_last_tokens_and_are_counted():
    ids, mask = left_padded([10, 3], 10)
    out_ids, out_mask, truncated = limit_prompts(ids, mask, PromptLimit(16, max_prompt_length=6), 4)
    assert truncated == 1 and out_ids.shape == (2, 6)
    np.testing.assert_array_equal(out_ids[0], np.arange(5, 11))          # the prompt's end survives
    np.testing.assert_array_equal(out_ids[1], [0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(out_mask.sum(-1), [6, 3])


def test_model_positions_bound_prompts_and_short_prompts_pass_unchanged():
    ids, mask = left_padded([5, 2], 5)
    out_ids, _, truncated = limit_prompts(ids, mask, PromptLimit(8), 3)
    assert truncated == 0 and out_ids is ids
    out_ids, _, truncated = limit_prompts(ids, mask, PromptLimit(8), 4)     # room for 4 new tokens
    assert truncated == 1 and out_ids.shape == (2, 4)
    with pytest.raises(PromptLengthError, match="max_new_tokens 8 leaves no room"):
        limit_prompts(ids, mask, PromptLimit(8), 8)


def test_truncation_off_refuses():
    ids, mask = left_padded([9], 9)
    with pytest.raises(PromptLengthError, match="longer than the 7 positions left for a prompt"):
        limit_prompts(ids, mask, PromptLimit(8, truncate=False), 1)


def test_generate_cli_truncates_warns_or_refuses(tiny_dir, capsys, caplog):
    model = tiny_dir("llama")
    long_prompt = " ".join(str(i % 10) for i in range(2000))          # far beyond 512 positions
    args = ["generate", "--model", str(model), "--prompt", long_prompt, "--max-new-tokens", "2",
            "--temperature", "0"]
    assert main(args) == 0
    assert any("keeping their last 510 tokens" in r.getMessage() for r in caplog.records)
    capsys.readouterr()
    assert main([*args, "--no-truncate-prompts"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "longer than the 510 positions left" in err[0]
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-new-tokens", "600"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_new_tokens 600 leaves no room" in err[0]


# --------------------------------------------------------------------------- through `jaxcore es` and rft-datagen

ES_FAST = ["train.epochs=1", "train.checkpoint_every=0", "train.eval_every=-1", "train.export_hf=false"]


def es_run(capsys, tiny_dir, out, *extra):
    from cli_runs import es_args, run_cli

    return run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, *ES_FAST, *extra))


def test_es_truncates_long_prompts_and_counts_them(tiny_dir, tmp_path, capsys, caplog):
    """Addition prompts are longer than 4 tokens: every row is cut to its last 4, warned and counted."""
    import json

    code, err = es_run(capsys, tiny_dir, tmp_path / "out", "rollout.max_prompt_length=4")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    truncated = [r["prompts/truncated"] for r in records if "prompts/truncated" in r]
    assert truncated and truncated[0] > 0, records
    assert any("max_prompt_length 4" in r.getMessage() and "keeping their last 4 tokens" in r.getMessage()
               for r in caplog.records)


def test_es_refuses_long_prompts_with_truncation_off(tiny_dir, tmp_path, capsys):
    code, err = es_run(capsys, tiny_dir, tmp_path / "out", "rollout.max_prompt_length=4",
                       "rollout.truncate_prompts=false")
    assert code == 2 and len(err) == 1, err
    assert "longer than max_prompt_length 4" in err[0] and "enable prompt truncation" in err[0], err


def test_es_refuses_max_new_tokens_beyond_the_positions(tiny_dir, tmp_path, capsys):
    code, err = es_run(capsys, tiny_dir, tmp_path / "out", "rollout.max_new_tokens=600")
    assert code == 2 and len(err) == 1, err
    assert "max_new_tokens 600 leaves no room" in err[0] and "512 positions" in err[0], err


def test_rft_datagen_jax_engine_truncates_long_prompts(tiny_dir, tmp_path, capsys, caplog):
    from cli_runs import run_datagen

    from torchref.rft.data import make_split, write_json

    write_json(tmp_path / "q.json", make_split("train", 2, 0))
    code, out, err = run_datagen(capsys, tiny_dir("llama"), tmp_path / "q.json", tmp_path / "rft.json",
                                 "--engine", "jax", "--max-prompt-length", "4")
    assert code == 0, (out, err)
    assert any("max_prompt_length 4" in r.getMessage() and "keeping their last 4 tokens" in r.getMessage()
               for r in caplog.records)


def test_a_token_the_model_has_no_embedding_for_is_one_line(tiny_dir, tmp_path, capsys):
    """A tokenizer with an added token beyond the model's vocab_size (before: the id was clamped to the last
    embedding row and the run exited 0): one line naming the prompt, the token and the vocab size."""
    import shutil

    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_dir("llama"), model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.add_tokens(["<extra_tool>"])
    tokenizer.save_pretrained(model)
    code = main(["generate", "--model", str(model), "--prompt", "plain", "--prompt", "call <extra_tool> now",
                 "--max-new-tokens", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "prompt 1: token" in err[0] and "'<extra_tool>'" in err[0] and "beyond the model's vocab_size" in err[0]
