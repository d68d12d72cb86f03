"""Batched encode/decode with a model directory's HF tokenizer (left padding, optional chat template)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxcore.convert import CheckpointError
from jaxcore.rewards.user_functions import Completion, is_conversation


def load_tokenizer(path: str | os.PathLike) -> Any:
    """`AutoTokenizer` from a local directory, left-padding, with a pad token."""
    from transformers import AutoTokenizer

    if not (Path(path) / "tokenizer.json").is_file() and not (Path(path) / "tokenizer_config.json").is_file():
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot load the tokenizer ({str(err).splitlines()[0]})") from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_chat_template(tokenizer: Any, prompt: str | list[dict[str, str]], system: str | None = None) -> str:
    """A prompt (a string as one user turn, or a conversation) rendered with the tokenizer's chat template.

    `system` is prepended unless the conversation already starts with a system message.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError("the tokenizer has no chat_template: conversational prompts and --chat-template "
                              "need one")
    messages = list(prompt) if is_conversation(prompt) else [{"role": "user", "content": prompt}]
    if system and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompts(tokenizer: Any, prompts: Sequence[str | list[dict[str, str]]], *, chat_template: bool = False,
                   system: str | None = None, max_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 ids and attention mask [B, T] for a list of prompts.

    Conversational prompts always go through the chat template (as in TRL); with any of them in the
    batch, plain strings do too (as a user turn).
    """
    templated = chat_template or any(is_conversation(p) for p in prompts)
    texts = [apply_chat_template(tokenizer, p, system) if templated else p for p in prompts]
    encoded = tokenizer(list(texts), padding=True, return_tensors="np", add_special_tokens=not templated,
                        truncation=max_length is not None, max_length=max_length)
    return encoded["input_ids"].astype(np.int32), encoded["attention_mask"].astype(np.int32)


def decode_completions(tokenizer: Any, tokens_BN: Any, lengths_B: Any, *, skip_special_tokens: bool = True
                       ) -> list[str]:
    """Text of each completion, up to its length (EOS dropped with the special tokens); each is a `str` that
    also carries its token ids (`.ids`, TRL's `completion_ids`)."""
    tokens_BN, lengths_B = np.asarray(tokens_BN), np.asarray(lengths_B)
    rows = [row[:n].tolist() for row, n in zip(tokens_BN, lengths_B)]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens)
    return [Completion(text, ids) for text, ids in zip(texts, rows)]


def eos_token_ids(tokenizer: Any, hf_config: dict[str, Any] | None = None) -> tuple[int, ...]:
    """EOS ids from the tokenizer, config.json and generation_config (all of them, deduplicated)."""
    ids: list[int] = []
    sources = [tokenizer.eos_token_id, (hf_config or {}).get("eos_token_id")]
    for source in sources:
        if source is None:
            continue
        ids.extend(source if isinstance(source, (list, tuple)) else [source])
    return tuple(dict.fromkeys(int(i) for i in ids))
