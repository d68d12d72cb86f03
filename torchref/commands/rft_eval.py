"""Accuracy (last <answer> within 5% of the reference) and answer rate (a parseable <answer>) on a question set.

Greedy decoding by default; --temperature > 0 with --samples N scores N samples per question.

examples:
  torchref rft-eval --model runs/rft/merged --questions data/rft/valid.json --json runs/rft/eval.json
  torchref rft-eval --model ./SmolLM2-360M-Instruct --questions data/rft/valid.json      # the baseline
  torchref rft-eval --model ./SmolLM2-360M-Instruct --adapter runs/rft/adapter --questions data/rft/valid.json
"""

from __future__ import annotations

import argparse
import json

from torchref.commands._common import (
    add_engine_arguments,
    add_overwrite_argument,
    add_prompt_arguments,
    prompt_options,
    show_progress,
)
from torchref.rft.engines import SamplingParams as S  # the sampling flags default to its settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF model directory (e.g. rft-train's OUT/merged)")
    parser.add_argument("--questions", required=True, help="JSON list of [question, answer] (e.g. valid.json)")
    parser.add_argument("--adapter", default=None, help="peft LoRA adapter directory to merge in (--engine hf)")
    parser.add_argument("--json", dest="json_out", default=None,
                        help="write metrics and every completion to this JSON file")
    add_overwrite_argument(parser, "--json file")
    parser.add_argument("--max-new-tokens", type=int, default=S.max_new_tokens, help=f"default {S.max_new_tokens}")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=S.top_p, help=f"nucleus sampling (default {S.top_p}: off)")
    parser.add_argument("--samples", type=int, default=1, help="completions per question (default 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="questions per batch (default 32)")
    parser.add_argument("--micro-batch-size", type=int, default=64, help="rows per generate call (default 64)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N questions")
    parser.add_argument("--seed", type=int, default=S.seed, help=f"sampling seed (default {S.seed})")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_engine_arguments(parser)
    add_prompt_arguments(parser)


def run(args: argparse.Namespace) -> int:
    show_progress(args.progress)
    from jaxcore.outputs import check_output, write_text
    from torchref.rft.data import load_questions
    from torchref.rft.engines import load_engine
    from torchref.rft.errors import RFTError
    from torchref.rft.evaluate import evaluate, format_table

    if args.samples < 1 or args.batch_size < 1 or args.micro_batch_size < 1:
        raise RFTError("--samples, --batch-size and --micro-batch-size must be >= 1")
    inputs = (args.model, args.questions, args.adapter)
    if args.json_out:                                          # before any work: never over an input
        check_output(args.json_out, kind="file", inputs=inputs, overwrite=args.overwrite, name="--json")
    questions = load_questions(args.questions)[:args.limit]
    params = S(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed)
    engine = load_engine(args.engine, args.model, params, dtype=args.dtype, adapter=args.adapter,
                         **prompt_options(args))
    result = evaluate(engine, questions, samples=args.samples, batch_size=args.batch_size,
                      micro_batch_size=args.micro_batch_size, chunk_size=args.samples, progress=args.progress)
    print(format_table(result["metrics"]))
    if args.json_out:
        record = {"model": args.model, "adapter": args.adapter, "questions_file": args.questions,
                  "engine": args.engine, "temperature": args.temperature, **result}
        write_text(args.json_out, json.dumps(record, indent=2) + "\n", inputs=inputs, overwrite=args.overwrite,
                   name="--json")
        print(f"wrote {args.json_out}")
    return 0
