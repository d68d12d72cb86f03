"""The `torchref` command: the RFT path (PyTorch + Hugging Face). Each subcommand lives in
`torchref.commands.<name>`; torch, transformers and peft load only when a command runs.

    torchref rft-data     --out data/rft --train 1000 --valid 100
    torchref rft-datagen  --model ./SmolLM2-360M-Instruct --questions data/rft/train.json --out data/rft/rft.json
    torchref rft-train    --model ./SmolLM2-360M-Instruct --data data/rft/rft.json --out runs/rft --merge
    torchref rft-eval     --model runs/rft/merged --questions data/rft/valid.json --json runs/rft/eval.json

`torchref COMMAND --help` lists every flag with an example.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

SUBCOMMANDS = {
    "rft-data": ("rft_data", "Write seeded unit-conversion questions (train.json, valid.json)"),
    "rft-datagen": ("rft_datagen", "Rejection sampling: keep the correct chain-of-thought completions"),
    "rft-train": ("rft_train", "LoRA SFT on the generated data with peft and the HF Trainer"),
    "rft-eval": ("rft_eval", "Accuracy and answer rate on a question set"),
}


def user_error_types() -> tuple[type[BaseException], ...]:
    """Bad-input exceptions, shown as one line without a traceback: jaxcore's plus the RFT path's."""
    from jaxcore.cli import user_error_types as jaxcore_user_errors
    from torchref.rft.errors import RFTError

    return (*jaxcore_user_errors(), RFTError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchref", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(f"torchref.commands.{module_name}")
        sub = subparsers.add_parser(name, help=help_text, description=module.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from jaxcore.cli import quiet_library_logs

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    quiet_library_logs()
    logging.getLogger("datasets").setLevel(logging.WARNING)   # "JAX version ... available" when the Trainer loads
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except user_error_types() as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"torchref {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
