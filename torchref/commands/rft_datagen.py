"""Rejection sampling: sample K chain-of-thought completions per question, keep the correct ones.

A completion is correct when the number in its last <answer>...</answer> is within 5% of the
reference. Output: a JSON list of [question, answer, reasoning] entries (the input of rft-train).
Every numeric knob also reads an environment variable (the flag wins over the variable).

examples:
  torchref rft-datagen --model ./SmolLM2-360M-Instruct --questions data/rft/train.json \\
      --out data/rft/rft.json --oversample 15 --temperature 0.7
  RFT_MICRO_BATCH_SIZE=256 RFT_CHUNK_SIZE=10 torchref rft-datagen --model ./SmolLM2-360M-Instruct \\
      --questions data/rft/train.json --out data/rft/rft.json --batch-size 8 --engine jax
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
from torchref.rft.datagen import KNOBS, DatagenConfig
from torchref.rft.engines import SamplingParams as S  # the sampling flags default to its settings
from torchref.rft.settings import add_knobs, resolve_knobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF model directory (config.json, safetensors, tokenizer)")
    parser.add_argument("--questions", required=True, help="JSON list of [question, answer] (from rft-data)")
    parser.add_argument("--out", required=True, help="output JSON list of [question, answer, reasoning]")
    add_overwrite_argument(parser, "--out or --stats file")
    add_knobs(parser, KNOBS)
    parser.add_argument("--keep", type=int, default=DatagenConfig.keep,
                        help="distinct correct completions kept per question; 0 keeps all "
                             f"(default {DatagenConfig.keep})")
    parser.add_argument("--top-p", type=float, default=S.top_p, help=f"nucleus sampling (default {S.top_p}: off)")
    parser.add_argument("--top-k", type=int, default=S.top_k, help=f"top-k sampling (default {S.top_k}: off)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N questions")
    parser.add_argument("--seed", type=int, default=S.seed, help=f"sampling seed (default {S.seed})")
    parser.add_argument("--stats", default=None, help="also write the run's statistics to this JSON file")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument("--max-prompt-length", type=int, default=S.max_prompt_length,
                        help="prompt tokens kept (default: the model's positions minus max_new_tokens)")
    parser.add_argument("--no-truncate-prompts", dest="truncate_prompts", action="store_false",
                        help="refuse over-long prompts instead of keeping their last tokens")
    add_engine_arguments(parser)
    add_prompt_arguments(parser)


def run(args: argparse.Namespace) -> int:
    show_progress(args.progress)
    from jaxcore.outputs import check_output, translated_os_errors, write_text
    from torchref.rft.data import load_questions, write_json
    from torchref.rft.datagen import generate_dataset
    from torchref.rft.engines import load_engine
    from torchref.rft.errors import RFTError

    knobs = resolve_knobs(args, KNOBS)
    if knobs["temperature"] <= 0:
        raise RFTError(f"rejection sampling needs temperature > 0, got {knobs['temperature']}")
    inputs = (args.model, args.questions)
    for flag, path in (("--out", args.out), ("--stats", args.stats)):   # before any work: never over an input
        if path:
            check_output(path, kind="file", inputs=inputs, overwrite=args.overwrite, name=flag)
    questions = load_questions(args.questions)[:args.limit]
    config = DatagenConfig(oversample=knobs["oversample"], batch_size=knobs["batch_size"],
                           micro_batch_size=knobs["micro_batch_size"], chunk_size=knobs["chunk_size"], keep=args.keep)
    params = S(max_new_tokens=knobs["max_new_tokens"], temperature=knobs["temperature"],
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_prompt_length=args.max_prompt_length, truncate_prompts=args.truncate_prompts)
    engine = load_engine(args.engine, args.model, params, dtype=args.dtype, **prompt_options(args))
    entries, stats = generate_dataset(engine, questions, config, progress=args.progress)
    with translated_os_errors(args.out):
        write_json(args.out, entries)
    summary = {**stats.as_dict(), "engine": args.engine, **knobs, "keep": args.keep}
    if args.stats:
        write_text(args.stats, json.dumps(summary, indent=2) + "\n", inputs=inputs, overwrite=args.overwrite,
                   name="--stats")
    print(f"wrote {args.out}: {stats.kept} entries; {stats.solved}/{stats.questions} questions solved "
          f"({stats.success_rate:.1%}), {stats.completions} completions in {stats.seconds:.1f} s "
          f"({summary['completions_per_s']:.1f}/s, answer rate {summary['answer_rate']:.1%})")
    return 0
