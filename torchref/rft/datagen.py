"""Rejection-sampling data generation: K chain-of-thought samples per question, keep the correct ones.

Questions go to the engine `batch_size` at a time; `engines.sample_batched` splits each batch into
generate calls of at most `micro_batch_size` rows with `num_return_sequences` in chunks of
`chunk_size`. A completion is correct when its last `<answer>` is within 5% of the reference
(`grading.correct`); up to `keep` distinct correct completions per question become
`[question, answer, reasoning]` entries.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

from torchref.rft.data import Question, SFTEntry
from torchref.rft.engines import Engine, SamplingParams, sample_batched
from torchref.rft.errors import RFTError
from torchref.rft.grading import answered, correct, reasoning_of
from torchref.rft.settings import Knob


@dataclasses.dataclass(frozen=True)
class DatagenConfig:
    oversample: int = 15
    batch_size: int = 8
    micro_batch_size: int = 64
    chunk_size: int = 8
    keep: int = 1               # correct completions kept per question; 0 keeps every distinct one

    def __post_init__(self) -> None:
        for name in ("oversample", "batch_size", "micro_batch_size", "chunk_size"):
            if getattr(self, name) < 1:
                raise RFTError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keep < 0:
            raise RFTError(f"keep must be >= 0, got {self.keep}")


KNOBS = (           # `rft-datagen`'s numeric flags, defaulting to `DatagenConfig` and `SamplingParams`
    Knob("oversample", "RFT_OVERSAMPLE", DatagenConfig.oversample, "completions sampled per question (K)"),
    Knob("batch_size", "RFT_BATCH_SIZE", DatagenConfig.batch_size, "questions per batch"),
    Knob("micro_batch_size", "RFT_MICRO_BATCH_SIZE", DatagenConfig.micro_batch_size,
         "rows (questions x samples) per generate call"),
    Knob("chunk_size", "RFT_CHUNK_SIZE", DatagenConfig.chunk_size, "num_return_sequences per generate call"),
    Knob("temperature", "RFT_TEMPERATURE", SamplingParams.temperature, "sampling temperature (> 0)"),
    Knob("max_new_tokens", "RFT_MAX_NEW_TOKENS", SamplingParams.max_new_tokens,
         "tokens generated per completion at most"),
)


@dataclasses.dataclass
class DatagenStats:
    questions: int = 0          # questions sampled so far
    solved: int = 0             # questions with at least one correct completion
    kept: int = 0               # entries written
    completions: int = 0
    correct: int = 0
    answered: int = 0           # completions with a parseable <answer>
    tokens: int = 0             # generated tokens, EOS included
    seconds: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.solved / max(self.questions, 1)

    def as_dict(self) -> dict[str, Any]:
        """Counts plus rates and throughput."""
        s = max(self.seconds, 1e-9)
        return {**dataclasses.asdict(self), "success_rate": self.success_rate,
                "sample_accuracy": self.correct / max(self.completions, 1),
                "answer_rate": self.answered / max(self.completions, 1),
                "completions_per_s": self.completions / s, "tokens_per_s": self.tokens / s}


def select_correct(question: Question, completions: Sequence[str], keep: int) -> list[SFTEntry]:
    """Up to `keep` (0: all) distinct correct completions, as SFT entries, in sampling order."""
    reasonings: dict[str, None] = {}
    for text in completions:
        if correct(text, question.answer):
            reasonings.setdefault(reasoning_of(text))
            if keep and len(reasonings) == keep:
                break
    return [SFTEntry(question.question, question.answer, r) for r in reasonings]


def generate_dataset(engine: Engine, questions: Sequence[Question], config: DatagenConfig, *,
                     progress: bool = True) -> tuple[list[SFTEntry], DatagenStats]:
    """Sample, grade and filter every question; a tqdm bar shows success rate and ETA."""
    from tqdm import tqdm

    entries: list[SFTEntry] = []
    stats = DatagenStats()
    start = time.perf_counter()
    with tqdm(total=len(questions), desc="rft-datagen", unit="q", file=sys.stderr, disable=not progress,
              dynamic_ncols=True) as bar:
        for first in range(0, len(questions), config.batch_size):
            batch = questions[first:first + config.batch_size]
            samples = sample_batched(engine, [q.question for q in batch], config.oversample,
                                     micro_batch_size=config.micro_batch_size, chunk_size=config.chunk_size)
            for question, generated in zip(batch, samples):
                kept = select_correct(question, generated.texts, config.keep)
                entries.extend(kept)
                stats.questions += 1
                stats.solved += bool(kept)
                stats.kept += len(kept)
                stats.completions += len(generated.texts)
                stats.correct += sum(correct(t, question.answer) for t in generated.texts)
                stats.answered += sum(answered(t) for t in generated.texts)
                stats.tokens += sum(generated.lengths)
            stats.seconds = time.perf_counter() - start
            bar.update(len(batch))
            bar.set_postfix(success=f"{stats.success_rate:.1%}", kept=stats.kept,
                            rate=f"{stats.completions / max(stats.seconds, 1e-9):.1f}/s")
    return entries, stats
