"""Numeric command-line settings with environment-variable overrides: the flag, else the variable, else the default.

    KNOBS = (Knob("micro_batch_size", "RFT_MICRO_BATCH_SIZE", 64, "rows per generate call"),)
    add_knobs(parser, KNOBS)                 # adds --micro-batch-size
    values = resolve_knobs(args, KNOBS)      # {"micro_batch_size": 64}, or $RFT_MICRO_BATCH_SIZE
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from torchref.rft.errors import RFTError


@dataclasses.dataclass(frozen=True)
class Knob:
    dest: str       # argparse destination (the flag is --dest-with-dashes)
    env: str        # environment variable that overrides the default
    default: int | float
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


def add_knobs(parser: argparse.ArgumentParser, knobs: Sequence[Knob]) -> None:
    """One `--flag` per knob; its help names the variable and the default."""
    for knob in knobs:
        parser.add_argument(knob.flag, dest=knob.dest, type=type(knob.default), default=None,
                            metavar=type(knob.default).__name__.upper(),
                            help=f"{knob.help} (env {knob.env}; default {knob.default})")


def resolve_knobs(args: argparse.Namespace, knobs: Sequence[Knob],
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The value of every knob: the flag if given, else the environment variable, else the default."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for knob in knobs:
        value = getattr(args, knob.dest, None)
        raw = environ.get(knob.env, "").strip()
        if value is None and raw:
            try:
                value = type(knob.default)(raw)
            except ValueError:
                raise RFTError(f"{knob.env}={raw!r}: expected {type(knob.default).__name__}") from None
        values[knob.dest] = knob.default if value is None else value
    return values
