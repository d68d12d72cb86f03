"""Arguments shared by the RFT subcommands (prompt format, engine), so every command formats prompts alike."""

from __future__ import annotations

import argparse
from typing import Any

from torchref.rft.engines import ENGINES
from torchref.rft.prompts import CHAT_MODES


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    """--template, --chat-template, --system: use the same values for datagen, train and eval."""
    parser.add_argument("--template", default=None,
                        help="prompt template with a {question} field (default: the question followed by the "
                             "unit-conversion instruction to reason and answer in <answer>...</answer>)")
    parser.add_argument("--chat-template", dest="chat", choices=CHAT_MODES, default="auto",
                        help="wrap the prompt as a user turn of the tokenizer's chat template "
                             "(auto: when the tokenizer has one; default auto)")
    parser.add_argument("--system", default=None, help="system message (needs the chat template)")


def prompt_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"template": args.template, "chat": args.chat, "system": args.system}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine and --dtype."""
    parser.add_argument("--engine", choices=ENGINES, default="hf",
                        help="hf: transformers generate (default); jax: jaxcore.inference.generate on the "
                             "converted model")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="inference dtype (auto: bf16 on bf16 GPUs, fp16 on older GPUs with --engine hf, "
                             "fp32 on the CPU)")


def show_progress(enabled: bool) -> None:
    """Turn transformers' own progress bars (weight loading, saving) off with --no-progress."""
    from transformers.utils import logging as hf_logging

    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()


def add_overwrite_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--overwrite: replace an existing, non-empty output (never an input: `jaxcore.outputs`)."""
    parser.add_argument("--overwrite", action="store_true", help=f"replace an existing, non-empty {what}")
