"""The collectives of a compiled program, read from its HLO text: what a multi-device run sends between
devices, for tests that count it on simulated devices."""

from __future__ import annotations

import math
import re
from collections import defaultdict

COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")
SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def collectives(hlo_text: str) -> dict[str, list[list[tuple[str, int]]]]:
    """{collective: [[(dtype, elements) of each array it returns], ...]} of a compiled program's text."""
    found: dict[str, list[list[tuple[str, int]]]] = defaultdict(list)
    for line in hlo_text.splitlines():
        match = COLLECTIVE.search(line)
        if match:
            found[match.group(2)].append([(dtype, math.prod(int(d) for d in dims.split(",") if d))
                                          for dtype, dims in SHAPE.findall(match.group(1))])
    return found


def f32_elements(ops: list[list[tuple[str, int]]]) -> int:
    return sum(n for arrays in ops for dtype, n in arrays if dtype == "f32")


def largest(found: dict[str, list[list[tuple[str, int]]]]) -> int:
    return max((n for ops in found.values() for arrays in ops for _, n in arrays), default=0)
