"""Reading a compiled program's optimised HLO text: the kernels it launches and the collectives it sends.

Counts, not clocks: what a step costs on a GPU beyond its bytes is mostly one launch per kernel, and what a
multi-device step sends is its collectives. Both are the compiler's own decisions, read from
`compiled.as_text()`, so they can be held in tests on any host (`jaxcore.bench.gpu_targets` compiles for a GPU
without one).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable

# Instructions that launch nothing: values already in memory, views, tuples and control flow (a loop's or a
# branch's kernels are those of its computations).
NOT_KERNELS = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier", "partition-id",
    "replica-id", "while", "conditional", "call", "add-dependency", "domain", "copy-done", "all-gather-done",
    "all-reduce-done", "collective-permute-done", "async-done", "send-done", "recv-done", "get-dimension-size",
})
COLLECTIVE_OPS = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = ")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\b(?:true_computation|false_computation)=%?([\w.\-]+)|branch_computations=\{([^}]*)\}")
_SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_NAME = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
            "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    result_type: str
    line: str

    @property
    def operands(self) -> list[str]:
        """The names of the instruction's operands (the instructions whose values it reads)."""
        rest = self.line.split(" = ", 1)[1]
        arguments, _ = _split_type(rest[rest.index(f"{self.opcode}(") + len(self.opcode):])
        return re.findall(r"%([\w.\-]+)", arguments)

    @property
    def called(self) -> str | None:
        match = _CALLS.search(self.line)
        return match.group(1) if match else None


def _split_type(rest: str) -> tuple[str, str]:
    """(result type, the text after it) of an instruction's right-hand side; a tuple type is bracketed."""
    if not rest.startswith("("):
        head, _, tail = rest.partition(" ")
        return head, tail
    depth = 0
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return rest[:i + 1], rest[i + 1:]
    return rest, ""


def computations(hlo_text: str) -> tuple[str, dict[str, list[Instruction]]]:
    """The entry computation's name and every computation's instructions, in order."""
    found: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and "=" not in line.split("{")[0].split("(")[0]:
                current = match.group(2)
                found[current] = []
                entry = current if match.group(1) else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        if _INSTRUCTION.match(line):
            rest = line.split(" = ", 1)[1]
            result_type, tail = _split_type(rest)
            opcode = _OPCODE.match(tail)
            if opcode:
                found[current].append(Instruction(_NAME.match(line).group(1), opcode.group(1), result_type, line))
    return entry, found


def kernel_counts(hlo_text: str) -> Counter:
    """{opcode: kernels launched by one run of the program}: every instruction of the entry that launches
    work (fusions, library calls, unfused operations, collectives), with each loop body counted as often as
    XLA knows it runs (`known_trip_count`; once where it does not know) and each branch of a conditional once."""
    entry, comps = computations(hlo_text)
    counts: Counter = Counter()

    def visit(name: str, times: int) -> None:
        for instruction in comps.get(name, []):
            if instruction.opcode == "while":
                trips = _TRIP_COUNT.search(instruction.line)
                body = _BODY.search(instruction.line)
                if body:
                    visit(body.group(1), times * (int(trips.group(1)) if trips else 1))
            elif instruction.opcode == "conditional":
                for match in _BRANCHES.finditer(instruction.line):
                    names = [match.group(1)] if match.group(1) else match.group(2).split(",")
                    for branch in names:
                        visit(branch.strip().lstrip("%"), times)
            elif instruction.opcode not in NOT_KERNELS and not instruction.opcode.endswith("-done"):
                counts[instruction.opcode] += times

    visit(entry, 1)
    return counts


def type_bytes(result_type: str) -> int:
    """Bytes of an HLO type (every array of a tuple)."""
    return sum(ITEMSIZE.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _SHAPE.findall(result_type))


def kernel_bytes(hlo_text: str) -> int:
    """The bytes one run of the entry computation's kernels moves: each kernel reads its operands and writes its
    result (less a library call's scratch workspace), except that a kernel updating a buffer in place (a fused
    `dynamic-update-slice`: a KV-cache write) reads and writes only the update. An upper bound where a kernel
    reads part of an operand (a gather of the embedding table); loops are not entered."""
    entry, comps = computations(hlo_text)
    types = {i.name: i.result_type for i in comps.get(entry, [])}
    total = 0
    for instruction in comps.get(entry, []):
        if instruction.opcode in NOT_KERNELS:
            continue
        sizes = [type_bytes(types.get(name, "")) for name in instruction.operands]
        body = comps.get(instruction.called or "", [])
        if (instruction.opcode == "dynamic-update-slice"
                or (body and body[-1].opcode == "dynamic-update-slice")) and sizes:
            total += 2 * (sum(sizes) - max(sizes))
        else:
            result = instruction.result_type
            if instruction.opcode == "custom-call" and result.startswith("("):     # less a library's scratch
                result = re.sub(r"[su]8\[[0-9,]*\](\{[^}]*\})?", "", result)
            total += sum(sizes) + type_bytes(result)
    return total


def kernels(hlo_text: str) -> int:
    """Kernels one run of the compiled program launches (`kernel_counts` summed)."""
    return sum(kernel_counts(hlo_text).values())


def collectives(hlo_text: str) -> dict[str, list[list[tuple[str, int]]]]:
    """{collective: [[(dtype, elements) of each array it returns], ...]}, one entry per collective instruction
    anywhere in the program (a loop body's once); a collective the program does not send reads as []."""
    found: dict[str, list[list[tuple[str, int]]]] = defaultdict(list)
    for instructions in computations(hlo_text)[1].values():
        for instruction in instructions:
            op = instruction.opcode.removesuffix("-start")
            if op in COLLECTIVE_OPS:
                found[op].append([(dtype, math.prod(int(d) for d in dims.split(",") if d))
                                  for dtype, dims in _SHAPE.findall(instruction.result_type)])
    return found


def collective_counts(hlo_text: str) -> dict[str, int]:
    """{collective: how many one run of the program sends}, loop bodies counted by their trip counts."""
    counts = kernel_counts(hlo_text)
    return {op: sum(n for name, n in counts.items() if name.removesuffix("-start") == op)
            for op in COLLECTIVE_OPS if any(name.removesuffix("-start") == op for name in counts)}


def summed_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Several programs' `collective_counts` added up (one run of each)."""
    total: Counter = Counter()
    for one in counts:
        total.update(one)
    return dict(total)
