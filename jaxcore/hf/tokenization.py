"""Batched encode/decode with a model directory's HF tokenizer (left padding, optional chat template)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxcore.errors import (  # noqa: F401  (PromptLengthError: re-exported)
    PromptLengthError,
    TaskError,
    UserError,
    read_json_object,
)
from jaxcore.hf.convert import CheckpointError
from jaxcore.rewards.user_functions import Completion, as_messages, is_conversation

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PromptLimit:
    """How long prompts may be: the model's positions, an optional shorter cap, truncate or refuse."""

    max_positions: int
    max_prompt_length: int | None = None
    truncate: bool = True               # True: keep the last tokens (left truncation, like TRL); False: refuse

    def prompt_tokens(self, max_new_tokens: int) -> int:
        """Prompt tokens that fit: the configured cap, and room for `max_new_tokens` in the positions."""
        return min(self.max_prompt_length or self.max_positions, self.max_positions - max_new_tokens)


def limit_prompts(ids_BT: np.ndarray, mask_BT: np.ndarray, limit: PromptLimit, max_new_tokens: int, *,
                  warn: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Left-padded prompts cut from the left to fit (or refused); returns ids, mask, rows truncated (with `warn`,
    a truncation is also logged: off where the same prompts are encoded again later, e.g. ahead of their epoch).

    A prompt may keep `limit.prompt_tokens(max_new_tokens)` tokens: at most max_prompt_length, and
    leaving max_new_tokens positions. Raises `PromptLengthError` when max_new_tokens leaves no room
    for a prompt, and for a prompt over the limit with truncation off.
    """
    if max_new_tokens >= limit.max_positions:
        raise PromptLengthError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's "
                                f"{limit.max_positions} positions")
    lengths_B = mask_BT.sum(-1)
    keep = limit.prompt_tokens(max_new_tokens)
    truncated = int((lengths_B > keep).sum())
    if truncated:
        what = (f"max_prompt_length {keep}" if keep == limit.max_prompt_length else
                f"the {keep} positions left for a prompt (model {limit.max_positions} - max_new_tokens "
                f"{max_new_tokens})")
        if not limit.truncate:
            raise PromptLengthError(f"{truncated} prompt(s) longer than {what} (longest {int(lengths_B.max())} "
                                    "tokens); shorten them or enable prompt truncation")
        if warn:
            log.warning("%d prompt(s) longer than %s (longest %d tokens): keeping their last %d tokens",
                        truncated, what, int(lengths_B.max()), keep)
        ids_BT, mask_BT = ids_BT[:, -keep:], mask_BT[:, -keep:]     # left padding: real tokens are on the right
    return ids_BT, mask_BT, truncated


def encode_prompts_limited(tokenizer: Any, prompts: Sequence[str], limit: PromptLimit, max_new_tokens: int, *,
                           chat_template: bool = False, system: str | None = None, vocab_size: int | None = None,
                           warn: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """`encode_prompts` then `limit_prompts`: ids, mask [B, T] and the number of prompts truncated. With
    `vocab_size` (the model's), a token the model has no embedding for is a one-line error (an embedding lookup
    would clamp it to the last row, silently)."""
    ids, mask = encode_prompts(tokenizer, prompts, chat_template=chat_template, system=system)
    if vocab_size is not None:
        check_token_ids(tokenizer, ids, mask, vocab_size)
    return limit_prompts(ids, mask, limit, max_new_tokens, warn=warn)


def check_token_ids(tokenizer: Any, ids_BT: np.ndarray, mask_BT: np.ndarray, vocab_size: int) -> None:
    """UserError naming the first prompt token (row, id, text) at or beyond the model's `vocab_size`."""
    beyond_BT = (np.asarray(ids_BT) >= vocab_size) & np.asarray(mask_BT, bool)
    if beyond_BT.any():
        row, col = (int(i[0]) for i in np.nonzero(beyond_BT))
        token_id = int(ids_BT[row, col])
        raise UserError(f"prompt {row}: token {token_id} ({tokenizer.convert_ids_to_tokens(token_id)!r}) is beyond "
                        f"the model's vocab_size {vocab_size}: the tokenizer has tokens the model has no embedding "
                        "for (added tokens?); resize the model's embeddings or use the model's own tokenizer")


def rollout_prompt_limit(rollout: Any, model_config: Any) -> PromptLimit:
    """The `PromptLimit` of prompt-limit settings (`runtime.config.PromptLimitConfig`, e.g. a training config's
    rollout section) for a model."""
    return PromptLimit(model_config.max_position_embeddings, rollout.max_prompt_length, rollout.truncate_prompts)


TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _check_json_object(file: Path) -> None:
    """A tokenizer JSON file, when present, is UTF-8 text holding one JSON object (else CheckpointError naming it)."""
    if not file.is_file():
        return
    read_json_object(file)


# tokenizer_config.json classes that are `tokenizers`' own fast tokenizer with no model-specific code: loaded as that
# class directly, AutoTokenizer's choice for them, without resolving a model config (which imports torch: ~2 s).
PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | os.PathLike) -> Any:
    """`AutoTokenizer` from a local directory, left-padding, with a pad token. Loaded once per process while its
    files stay unchanged (a run's planning and its training share it)."""
    files = tuple(Path(path) / name for name in (*TOKENIZER_JSON, "tokenizer.model"))
    stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None for f in files)
    return _load_tokenizer(str(path), str(Path(path).absolute()), stamp)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str, _absolute: str, _stamp: tuple[Any, ...]) -> Any:
    if not has_tokenizer_files(path):
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    for name in TOKENIZER_JSON[1:]:        # the small ones first; tokenizer.json (megabytes) only if loading fails
        _check_json_object(Path(path) / name)
    config = Path(path) / "tokenizer_config.json"
    plain = config.is_file() and read_json_object(config).get("tokenizer_class") in PLAIN_FAST_TOKENIZERS
    if plain and (Path(path) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast as AutoTokenizer
    else:
        from transformers import AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:   # tokenizers' Rust errors are plain Exceptions; the files are the user's input
        _check_json_object(Path(path) / TOKENIZER_JSON[0])           # a malformed tokenizer.json, named
        files = " / ".join(name for name in TOKENIZER_JSON if (Path(path) / name).is_file())
        message = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        raise CheckpointError(f"{path}: cannot load the tokenizer from {files or 'its files'} ({message})") from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def has_tokenizer_files(path: str | os.PathLike) -> bool:
    """Whether `path` holds a tokenizer to load (tokenizer.json or tokenizer_config.json)."""
    return any((Path(path) / name).is_file() for name in TOKENIZER_JSON[:2])


def tokenizer_if_present(path: str | os.PathLike | None, chat_template_kwargs: dict[str, Any] | None = None
                         ) -> Any | None:
    """`load_tokenizer(path)` rendering with `chat_template_kwargs` (`with_chat_template_kwargs`); None where
    `path` has no tokenizer files."""
    if path is None or not has_tokenizer_files(path):
        return None
    return with_chat_template_kwargs(load_tokenizer(path), chat_template_kwargs)


def with_chat_template_kwargs(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> Any:
    """`tokenizer`, or (with `chat_template_kwargs`) a copy whose every `apply_chat_template` call renders with
    those extra template variables (TRL's `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`): prompts,
    multi-turn episodes and the memory plan's prompt lengths all see the same text. A call's own keyword wins."""
    if not chat_template_kwargs:
        return tokenizer
    bound, render, fixed = copy.copy(tokenizer), tokenizer.apply_chat_template, dict(chat_template_kwargs)

    def apply_chat_template(conversation: Any, *args: Any, **options: Any) -> Any:
        return render(conversation, *args, **{**fixed, **options})

    bound.apply_chat_template = apply_chat_template
    return bound


def apply_chat_template(tokenizer: Any, prompt: str | list[dict[str, str]], system: str | None = None) -> str:
    """A prompt (a string as one user turn, or a conversation) rendered with the tokenizer's chat template.

    `system` is prepended unless the conversation already starts with a system message.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError("the tokenizer has no chat_template: conversational prompts and --chat-template "
                              "need one")
    messages = as_messages(prompt)
    if system and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system}, *messages]
    return render_chat(tokenizer, messages, tokenize=False, add_generation_prompt=True)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> Any:
    """`tokenizer.apply_chat_template(messages, **options)`. A template that refuses a conversation (its
    `raise_exception`: roles that do not alternate, a system turn it does not take) is a one-line `TaskError`
    naming the conversation's first message, so the dataset row can be found."""
    try:
        return tokenizer.apply_chat_template(messages, **options)
    except Exception as err:  # noqa: BLE001 -- jinja2's TemplateError, or what the template's own code raises
        first = " ".join(str(messages[0].get("content", "")).split())[:60] if messages else ""
        roles = "/".join(str(m.get("role")) for m in messages)
        reason = " ".join(str(err).split()) or type(err).__name__
        raise TaskError(f"the chat template refuses the conversation ({roles}) that starts {first!r}: "
                        f"{reason}") from None


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
    """The ids that end a completion, as TRL's GRPOTrainer takes them: the model's generation config's `eos_token_id`
    (one id or a list; transformers' `generate` stops at each), after the tokenizer's EOS where it lacks it. That
    config is generation_config.json in the tokenizer's directory (an HF model directory, or the tokenizer files a
    jaxcore checkpoint keeps) where the file exists, else config.json's keys (`hf_config`), as transformers loads
    it."""
    generation = generation_config(tokenizer)
    source = (generation if generation is not None else hf_config or {}).get("eos_token_id")
    listed = source if isinstance(source, (list, tuple)) else [] if source is None else [source]
    where = "generation_config.json" if generation is not None else "config.json"
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in listed):
        raise CheckpointError(f"{where}: eos_token_id must be a token id or a list of them, got {source!r}")
    ids = [int(i) for i in listed]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.insert(0, int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def generation_config(tokenizer: Any) -> dict[str, Any] | None:
    """generation_config.json beside the tokenizer's files, or None where there is none (or the tokenizer was not
    loaded from a directory)."""
    path = Path(getattr(tokenizer, "name_or_path", "") or "") / "generation_config.json"
    return read_json_object(path) if path.is_file() else None
