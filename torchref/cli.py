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
    from jaxcore.cli import make_parser

    return make_parser("torchref", __doc__, {name: (f"torchref.commands.{module}", help_text)
                                             for name, (module, help_text) in SUBCOMMANDS.items()})


def main(argv: Sequence[str] | None = None) -> int:
    from jaxcore.cli import dispatch

    return dispatch(build_parser, argv, user_error_types)


if __name__ == "__main__":
    sys.exit(main())
