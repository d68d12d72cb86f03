"""Sample completions with jaxcore's batched KV-cache generation.

examples:
  jaxcore generate --model ./SmolLM2-135M --prompt "The capital of France is" --max-new-tokens 32
  jaxcore generate --model ./ckpt --prompts-file prompts.jsonl --output out.jsonl --temperature 0.7 --top-p 0.9
  jaxcore generate --model ./SmolLM2-135M-Instruct --chat-template --prompt "What is 2+2?" --temperature 0

--prompts-file takes JSONL with a "prompt" field per line (or plain text, one prompt per line).
Output: one JSON object per completion {"prompt", "completion", "tokens", "finished", "logprob"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Annotated, Any

from annotated_types import Ge

from jaxcore.config.schema import field_flag, flag_type

POSITIVE = Annotated[int, Ge(1)]
SAMPLING, ROLLOUT = "jaxcore.inference.sampling.SamplingConfig", "jaxcore.runtime.config.RolloutConfig"
TRAIN, MODEL = "jaxcore.runtime.config.TrainConfig", "jaxcore.runtime.config.ModelSource"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF model directory or jaxcore checkpoint")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--prompts-file", help="JSONL with a 'prompt' field (a string, or a conversation: a list of "
                                               "role/content messages, rendered with the chat template), or a text "
                                               "file, one per line")
    parser.add_argument("--output", help="write JSONL here instead of printing (renamed into place when complete)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --output")
    # Each number is checked against the range of the config field it shares (`jaxcore.config.schema`).
    parser.add_argument("--max-new-tokens", type=field_flag(ROLLOUT, "max_new_tokens"), default=64)
    parser.add_argument("--temperature", type=field_flag(SAMPLING, "temperature"), default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=field_flag(SAMPLING, "top_k"), default=0)
    parser.add_argument("--top-p", type=field_flag(SAMPLING, "top_p"), default=1.0)
    parser.add_argument("--min-p", type=field_flag(SAMPLING, "min_p"), default=0.0)
    parser.add_argument("--repetition-penalty", type=field_flag(SAMPLING, "repetition_penalty"), default=1.0,
                        help="> 1: tokens already in the prompt or completion are less likely (transformers')")
    parser.add_argument("--num-return-sequences", type=flag_type(POSITIVE), default=1)
    parser.add_argument("--batch-size", type=flag_type(POSITIVE), default=64, help="prompts per generate call")
    parser.add_argument("--seed", type=field_flag(TRAIN, "seed"), default=0)
    parser.add_argument("--dtype", default="float32", type=field_flag(MODEL, "dtype"),
                        help="compute dtype: float32 or bfloat16")
    parser.add_argument("--chat-template", action="store_true", help="wrap each prompt as a user turn")
    parser.add_argument("--system", help="system message (with --chat-template)")
    parser.add_argument("--max-prompt-length", type=field_flag(ROLLOUT, "max_prompt_length"),
                        help="prompt tokens kept (default: the model's positions)")
    parser.add_argument("--no-truncate-prompts", action="store_true",
                        help="refuse over-long prompts instead of keeping their last tokens")


def read_prompts(path: str) -> list[str | list[dict[str, str]]]:
    """Prompts from JSONL ({"prompt": ...} per line: a string, or a conversation, TRL's list of {"role", "content"}
    messages) or plain text (one per line), strictly UTF-8."""
    from jaxcore.errors import UserError, check_text, read_text

    prompts = []
    for number, line in enumerate(read_text(path, "prompts file").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{number}: invalid JSON ({err.msg})") from err
            prompt = record.get("prompt") if isinstance(record, dict) else None
            if isinstance(prompt, list):
                prompts.append(conversation(prompt, f"{path}:{number}: field 'prompt'"))
                continue
            if not isinstance(prompt, str):
                raise UserError(f"{path}:{number}: missing field 'prompt' (a string, or a conversation: a list of "
                                "{'role': ..., 'content': ...} messages)")
            prompts.append(check_text(prompt, f"{path}:{number}: field 'prompt'"))
        else:
            prompts.append(line)
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts


def conversation(messages: list[Any], where: str) -> list[dict[str, str]]:
    """A conversational prompt: a non-empty list of {"role": str, "content": str} messages, or a UserError naming
    the first message that is not one."""
    from jaxcore.errors import UserError, check_text

    if not messages:
        raise UserError(f"{where}: an empty conversation")
    for index, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise UserError(f"{where}: message {index} is not a {{'role': str, 'content': str}} message: "
                            f"{json.dumps(message)[:80]}")
        check_text(message["content"], f"{where}: message {index}")
    return [dict(m) for m in messages]


def run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np
    from tqdm import tqdm

    from jaxcore.errors import UserError
    from jaxcore.hf.model_checkpoint import load_any
    from jaxcore.hf.tokenization import (
        PromptLimit,
        decode_completions,
        encode_prompts_limited,
        eos_token_ids,
        load_tokenizer,
    )
    from jaxcore.inference.generate import generate
    from jaxcore.outputs import check_output, open_output

    inputs = (args.prompts_file, args.model)
    if args.output:                                           # before reading anything: never over an input
        check_output(args.output, kind="file", inputs=inputs, overwrite=args.overwrite, name="--output")
    prompts = list(args.prompt) + (read_prompts(args.prompts_file) if args.prompts_file else [])
    if not prompts:
        raise UserError("give --prompt or --prompts-file")
    # a conversation is rendered with the chat template (as in training), and then every prompt is, each batch alike
    chat_template = args.chat_template or any(isinstance(p, list) for p in prompts)
    if args.system is not None and not chat_template:
        raise UserError("--system needs --chat-template (the system message is a turn of the chat template; without "
                        "it the prompts are tokenized as plain text)")
    model, tok_dir = load_any(args.model, args.dtype)
    if tok_dir is None:
        raise UserError(f"{args.model}: no tokenizer files")
    tokenizer = load_tokenizer(tok_dir)
    eos = eos_token_ids(tokenizer, model.config.hf_config)
    limit = PromptLimit(model.config.max_position_embeddings, args.max_prompt_length, not args.no_truncate_prompts)
    key = jax.random.key(args.seed)
    batches = range(0, len(prompts), args.batch_size)
    with (open_output(args.output, inputs=inputs, overwrite=args.overwrite, name="--output") if args.output
          else contextlib.nullcontext(sys.stdout)) as out:
        for index in tqdm(batches, desc="generate", unit="batch", disable=len(batches) < 2, file=sys.stderr):
            chunk = prompts[index:index + args.batch_size]
            ids, mask, _ = encode_prompts_limited(tokenizer, chunk, limit, args.max_new_tokens,
                                                  chat_template=chat_template, system=args.system,
                                                  vocab_size=model.config.vocab_size)
            try:
                result = generate(model, ids, mask, max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                  min_p=args.min_p, repetition_penalty=args.repetition_penalty, eos_token_ids=eos,
                                  pad_token_id=tokenizer.pad_token_id,
                                  num_return_sequences=args.num_return_sequences,
                                  key=jax.random.fold_in(key, index))
            except ValueError as err:
                raise UserError(str(err)) from err
            texts = decode_completions(tokenizer, result.tokens, result.lengths)
            lengths, finished = np.asarray(result.lengths), np.asarray(result.finished)
            logprob = np.asarray(result.logprobs).sum(-1)
            for row, text in enumerate(texts):
                record = {"prompt": chunk[row // args.num_return_sequences], "completion": text,
                          "tokens": int(lengths[row]), "finished": bool(finished[row]),
                          "logprob": round(float(logprob[row]), 4)}
                out.write(json.dumps(record) + "\n")
    return 0
