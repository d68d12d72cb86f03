"""How a question becomes model input, identically for datagen, training and eval.

The default template is the `unit_conversion` task's own instruction (reason, then `<answer>...</answer>`).
With `chat=True` the filled template becomes a user turn of the tokenizer's chat template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxcore.hf.tokenization import encode_prompts
from torchref.rft.data import INSTRUCTION
from torchref.rft.errors import RFTError

DEFAULT_TEMPLATE = "{question}" + INSTRUCTION
CHAT_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """`template` (with a `{question}` field), whether to apply the chat template, and a system message."""

    template: str = DEFAULT_TEMPLATE
    chat: bool = False
    system: str | None = None

    def __post_init__(self) -> None:
        if "{question}" not in self.template:
            raise RFTError(f"the prompt template must contain {{question}}: {self.template!r}")
        try:
            self.template.format(question="")
        except (KeyError, IndexError, ValueError) as err:
            raise RFTError(f"bad prompt template {self.template!r}: only {{question}} may appear in braces "
                           f"(write other braces twice): {err!r}") from None

    def user_text(self, question: str) -> str:
        """The filled template (the user turn when `chat`)."""
        return self.template.format(question=question)

    def encode(self, tokenizer: Any, questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded ids and mask [B, T] (the same tokenisation for every engine and for training)."""
        return encode_prompts(tokenizer, [self.user_text(q) for q in questions], chat_template=self.chat,
                              system=self.system)


def resolve_format(tokenizer: Any, *, template: str | None = None, chat: str = "auto",
                   system: str | None = None) -> PromptFormat:
    """A PromptFormat; `chat` "auto" uses the chat template when the tokenizer has one."""
    if chat not in CHAT_MODES:
        raise RFTError(f"chat template mode must be one of {', '.join(CHAT_MODES)}, got {chat!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat == "on" and not has_template:
        raise RFTError("the tokenizer has no chat_template; use --chat-template off")
    use_chat = chat == "on" or (chat == "auto" and has_template)
    if system and not use_chat:
        raise RFTError("--system needs the chat template (--chat-template auto/on with a chat tokenizer)")
    return PromptFormat(template or DEFAULT_TEMPLATE, use_chat, system)
