"""Samplers for datagen and eval: HF `generate` (torch) or `jaxcore.inference.generate`, behind one interface.

An engine turns questions into completions, `num_return_sequences` per question, rows question-major.
`sample_batched` splits a batch of questions into engine calls: `num_return_sequences` in chunks of
`chunk_size`, and as many questions per call as fit in `micro_batch_size` rows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jaxcore.hf.convert import CheckpointError, read_hf_config
from jaxcore.hf.tokenization import PromptLimit, decode_completions, eos_token_ids, limit_prompts, load_tokenizer
from jaxcore.inference.sampling import SamplingConfig
from jaxcore.runtime.config import PromptLimitConfig
from torchref.rft.errors import RFTError
from torchref.rft.prompts import PromptFormat, resolve_format

ENGINES = ("hf", "jax")


@dataclasses.dataclass(unsafe_hash=True)
class SamplingParams(SamplingConfig, PromptLimitConfig):
    """Decoding settings shared by both engines: jaxcore's sampling settings (`SamplingConfig`: temperature,
    top_k, top_p, min_p, with its checks; `temperature=0` is greedy, `top_k=0` off) and prompt limits
    (`PromptLimitConfig`), at RFT's temperature."""

    temperature: float = 0.7               # RFT samples at 0.7 (SamplingConfig's default is 1.0)
    max_new_tokens: int = 256
    seed: int = 0

    def prompt_limit(self, max_positions: int) -> PromptLimit:
        return PromptLimit(max_positions, self.max_prompt_length, self.truncate_prompts)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RFTError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        try:                                   # the same checks as jaxcore's sampler, one source of truth
            super().__post_init__()
        except ValueError as err:
            raise RFTError(str(err)) from err


@dataclasses.dataclass
class Generated:
    """Completion texts (question-major) and their generated token counts (EOS included)."""

    texts: list[str]
    lengths: list[int]


class Engine(Protocol):
    tokenizer: Any
    prompt_format: PromptFormat

    def generate(self, questions: Sequence[str], num_return_sequences: int) -> Generated:
        """`num_return_sequences` completions of every question, rows question-major."""
        ...


def sample_batched(engine: Engine, questions: Sequence[str], num_samples: int, *, micro_batch_size: int,
                   chunk_size: int) -> list[Generated]:
    """`num_samples` completions per question, in engine calls of at most `micro_batch_size` rows."""
    if num_samples < 1 or micro_batch_size < 1 or chunk_size < 1:
        raise RFTError("num_samples, micro_batch_size and chunk_size must be >= 1")
    out = [Generated([], []) for _ in questions]
    done = 0
    while done < num_samples:
        n = min(chunk_size, num_samples - done, micro_batch_size)
        per_call = max(1, micro_batch_size // n)
        for start in range(0, len(questions), per_call):
            result = engine.generate(questions[start:start + per_call], n)
            for row, (text, length) in enumerate(zip(result.texts, result.lengths)):
                target = out[start + row // n]
                target.texts.append(text)
                target.lengths.append(length)
        done += n
    return out


def existing_dir(path: str | os.PathLike) -> Path:
    """`path` as a Path, or a one-line CheckpointError if it is not a directory."""
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: no such model directory")
    return Path(path)


def generated_lengths(tokens_RN: np.ndarray, eos_ids: Sequence[int]) -> list[int]:
    """Tokens up to and including the first EOS (all of them when there is none)."""
    is_eos = np.isin(tokens_RN, np.asarray(list(eos_ids) or [-1]))
    first = np.where(is_eos.any(-1), is_eos.argmax(-1) + 1, tokens_RN.shape[1])
    return first.tolist()


class HFEngine:
    """`transformers` `generate` on the first GPU (bf16 where supported) or the CPU (fp32)."""

    def __init__(self, model_dir: str | os.PathLike, params: SamplingParams, *, dtype: str = "auto",
                 chat: str = "auto", template: str | None = None, system: str | None = None,
                 adapter: str | os.PathLike | None = None) -> None:
        import torch

        from torchref.model import load_reference
        from torchref.rft.lora import merge_adapter
        from torchref.rft.precision import inference_device, inference_dtype

        self.tokenizer = load_tokenizer(existing_dir(model_dir))
        self.prompt_format = resolve_format(self.tokenizer, template=template, chat=chat, system=system)
        self.params = params
        hf_config = read_hf_config(model_dir)
        self.eos = eos_token_ids(self.tokenizer, hf_config)
        self.max_positions = int(hf_config.get("max_position_embeddings", hf_config.get("n_positions", 2048)))
        self.device = inference_device()
        self.dtype = inference_dtype(dtype)
        try:   # with an adapter: merge in fp32 on the CPU (as rft-train --merge does), then cast
            model = load_reference(model_dir, torch.float32 if adapter else self.dtype)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{model_dir}: cannot load the model ({str(err).splitlines()[0]})") from err
        if adapter is not None:
            model = merge_adapter(model, adapter).to(self.dtype)
        self.model = model.to(self.device).eval()
        torch.manual_seed(params.seed)

    def generate(self, questions: Sequence[str], num_return_sequences: int) -> Generated:
        import torch
        from transformers import GenerationConfig

        p = self.params
        ids, mask, _ = limit_prompts(*self.prompt_format.encode(self.tokenizer, questions),
                                     p.prompt_limit(self.max_positions), p.max_new_tokens)
        sampling = p.temperature > 0
        if not sampling:   # HF refuses num_return_sequences > 1 without sampling: repeat the rows instead
            ids, mask = np.repeat(ids, num_return_sequences, 0), np.repeat(mask, num_return_sequences, 0)
        config = GenerationConfig(
            max_new_tokens=p.max_new_tokens, do_sample=sampling,
            num_return_sequences=num_return_sequences if sampling else 1,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=list(self.eos),
            **(dict(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, **({"min_p": p.min_p} if p.min_p else {}))
               if sampling else {}))
        with torch.inference_mode():
            out = self.model.generate(input_ids=torch.as_tensor(ids, dtype=torch.long, device=self.device),
                                      attention_mask=torch.as_tensor(mask, dtype=torch.long, device=self.device),
                                      generation_config=config)
        new_RN = out[:, ids.shape[1]:].cpu().numpy()
        lengths = generated_lengths(new_RN, self.eos)
        return Generated(decode_completions(self.tokenizer, new_RN, lengths), lengths)


class JaxEngine:
    """`jaxcore.inference.generate` on the HF directory converted in memory (or a jaxcore checkpoint)."""

    def __init__(self, model_dir: str | os.PathLike, params: SamplingParams, *, dtype: str = "auto",
                 chat: str = "auto", template: str | None = None, system: str | None = None) -> None:
        import jax

        from jaxcore.hf.model_checkpoint import load_any, tokenizer_dir

        if dtype == "auto":
            dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
        path = existing_dir(model_dir)
        tok_dir = tokenizer_dir(path) if (path / "jaxcore.json").is_file() else path
        if tok_dir is None:
            raise CheckpointError(f"{model_dir}: the checkpoint has no tokenizer files")
        self.tokenizer = load_tokenizer(tok_dir)   # before converting, so a missing tokenizer fails fast
        self.model, _ = load_any(path, dtype)
        self.prompt_format = resolve_format(self.tokenizer, template=template, chat=chat, system=system)
        self.params = params
        self.eos = eos_token_ids(self.tokenizer, self.model.config.hf_config)
        self.key = jax.random.key(params.seed)
        self.calls = 0

    def generate(self, questions: Sequence[str], num_return_sequences: int) -> Generated:
        import jax

        from jaxcore.inference.generate import generate

        p = self.params
        ids, mask, _ = limit_prompts(*self.prompt_format.encode(self.tokenizer, questions),
                                     p.prompt_limit(self.model.config.max_position_embeddings), p.max_new_tokens)
        result = generate(self.model, ids, mask, max_new_tokens=p.max_new_tokens, temperature=p.temperature,
                          top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, eos_token_ids=self.eos,
                          num_return_sequences=num_return_sequences, key=jax.random.fold_in(self.key, self.calls),
                          pad_token_id=self.tokenizer.pad_token_id)
        self.calls += 1
        lengths = np.asarray(result.lengths).tolist()
        return Generated(decode_completions(self.tokenizer, result.tokens, lengths), lengths)


def load_engine(name: str, model_dir: str | os.PathLike, params: SamplingParams, **options: Any) -> Engine:
    """An engine by name ("hf" or "jax"); options: dtype, chat, template, system (adapter: hf only)."""
    if name == "hf":
        return HFEngine(model_dir, params, **options)
    if name == "jax":
        if options.pop("adapter", None) is not None:
            raise RFTError("--adapter works with --engine hf only; merge the adapter first (rft-train --merge)")
        return JaxEngine(model_dir, params, **options)
    raise RFTError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
