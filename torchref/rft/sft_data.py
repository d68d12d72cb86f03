"""SFT examples: prompt tokens (masked out of the loss) followed by reasoning + EOS tokens (trained on).

The prompt is tokenised exactly as at generation time (`PromptFormat.encode`), and the target
separately, so training sees the same token boundary the model continues from when sampling.
Batches are right-padded; padding and prompt positions carry the label -100.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from torchref.rft.data import SFTEntry
from torchref.rft.errors import RFTError
from torchref.rft.prompts import PromptFormat

IGNORE_INDEX = -100


def encode_example(tokenizer: Any, fmt: PromptFormat, question: str, reasoning: str,
                   max_length: int) -> dict[str, list[int]] | None:
    """input_ids and labels for one example, truncated to `max_length`; None if no target token fits."""
    ids, mask = fmt.encode(tokenizer, [question])
    prompt = ids[0][mask[0] == 1].tolist()
    target = tokenizer(reasoning, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        target = [*target, tokenizer.eos_token_id]
    input_ids = (prompt + target)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt) + target)[:max_length]
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": input_ids, "labels": labels}


class SFTDataset(torch.utils.data.Dataset):
    """Tokenised SFT entries (examples whose prompt alone exceeds `max_length` are dropped)."""

    def __init__(self, entries: Sequence[SFTEntry], tokenizer: Any, fmt: PromptFormat, max_length: int) -> None:
        encoded = [encode_example(tokenizer, fmt, e.question, e.reasoning, max_length) for e in entries]
        self.examples = [e for e in encoded if e is not None]
        self.dropped = len(encoded) - len(self.examples)
        if not self.examples:
            raise RFTError(f"no training example fits in --max-length {max_length} tokens")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]


@dataclasses.dataclass
class PadCollator:
    """Right-pads input_ids (with `pad_id`), labels (with -100) and builds the attention mask."""

    pad_id: int
    multiple_of: int = 8

    def __call__(self, batch: Sequence[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        longest = max(len(b["input_ids"]) for b in batch)
        length = -(-longest // self.multiple_of) * self.multiple_of
        ids = torch.full((len(batch), length), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[row, :n] = torch.tensor(b["input_ids"])
            labels[row, :n] = torch.tensor(b["labels"])
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}
