"""The collectives of a compiled program, read from its HLO text (`jaxcore.bench.hlo.collectives`): what a
multi-device run sends between devices, for tests that count it on simulated devices."""

from __future__ import annotations

from jaxcore.bench.hlo import collectives  # noqa: F401  (the tests' reader)


def f32_elements(ops: list[list[tuple[str, int]]]) -> int:
    return sum(n for arrays in ops for dtype, n in arrays if dtype == "f32")


def largest(found: dict[str, list[list[tuple[str, int]]]]) -> int:
    return max((n for ops in found.values() for arrays in ops for _, n in arrays), default=0)
