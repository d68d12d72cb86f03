"""Write seeded unit-conversion questions as JSON lists of [question, answer] (answers are floats).

Questions come from jaxcore's `unit_conversion` task; train and valid never share a question.

examples:
  torchref rft-data --out data/rft --train 1000 --valid 100 --seed 0
  -> data/rft/train.json, data/rft/valid.json, e.g. ["Convert 3.5 kilometers to meters.", 3500.0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchref.commands._common import add_overwrite_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory")
    add_overwrite_argument(parser, "train.json/valid.json in --out")
    parser.add_argument("--train", type=int, default=1000, help="training questions (default 1000)")
    parser.add_argument("--valid", type=int, default=100, help="validation questions (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from jaxcore.outputs import check_output, translated_os_errors
    from torchref.rft.data import make_split, write_json
    from torchref.rft.errors import RFTError

    if args.train < 0 or args.valid < 0:
        raise RFTError("--train and --valid must be >= 0")
    splits = (("train", args.train), ("valid", args.valid))
    for split, _ in splits:                                   # every output checked before any is written
        check_output(Path(args.out) / f"{split}.json", kind="file", overwrite=args.overwrite, name="--out file")
    for split, n in splits:
        with translated_os_errors(Path(args.out) / f"{split}.json"):
            path = write_json(Path(args.out) / f"{split}.json", make_split(split, n, args.seed))
        print(f"wrote {path} ({n} questions)")
    return 0
