"""Prompt length limits: left truncation (warned, counted) or refusal, and max_new_tokens within positions."""

import numpy as np
import pytest

from jaxcore.cli import main
from jaxcore.tokenization import PromptLengthError, PromptLimit, limit_prompts


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
