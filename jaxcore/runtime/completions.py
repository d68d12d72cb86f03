"""A rollout's completions as TRL's `log_completions` keeps them: every row's prompt, completion, each reward
function's value and advantage, written per logged step to `out_dir/completions/completions_<step>.parquet` (TRL's
file, columns and names) and, with `rich` installed, a sample printed as a table."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxcore.hf.tokenization import decode_completions
from jaxcore.inference.generate import GenerationResult
from jaxcore.outputs import open_output
from jaxcore.parallel.rows import gather_rows
from jaxcore.rewards import Example
from jaxcore.rewards.user_functions import as_trl_completion


@dataclasses.dataclass
class CompletionLog:
    """One rollout's rows: prompts and completions as TRL passes them to reward functions (a conversation's
    completion as an assistant message), each reward function's values (None where it gave none), the columns the
    reward functions logged with TRL's `log_extra` and advantages."""

    prompts: list[Any]
    completions: list[Any]
    rewards: dict[str, list[float | None]]
    advantages: list[float] | None
    extra: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_rollout(cls, tokenizer: Any, result: GenerationResult, row_examples: Sequence[Example],
                   per_function: Mapping[str, np.ndarray], advantages_B: np.ndarray | None,
                   messages: Sequence[Any] | None = None, extra: Mapping[str, list[Any]] | None = None
                   ) -> CompletionLog:
        """The log of a rollout of `row_examples` (one per row); every process calls it (the rows are gathered),
        `messages` a multi-turn rollout's completions as messages, `extra` the log_extra columns of every row."""
        texts = decode_completions(tokenizer, gather_rows(result.tokens), gather_rows(result.lengths))
        messages = list(messages) if messages else [None] * len(texts)    # a process has its own rows'
        completions = [m if m is not None else as_trl_completion(text, example)
                       for m, text, example in zip(messages, texts, row_examples)]
        rewards = {name: [float(v) if np.isfinite(v) else None for v in np.asarray(values)]
                   for name, values in per_function.items()}
        return cls([e.prompt for e in row_examples], completions, rewards,
                   None if advantages_B is None else [float(a) for a in np.asarray(advantages_B)], dict(extra or {}))

    def rows(self, step: int) -> dict[str, list[Any]]:
        """TRL's table: step, prompt, completion, one column per reward function, the log_extra columns, advantage."""
        return {"step": [step] * len(self.prompts), "prompt": self.prompts, "completion": self.completions,
                **self.rewards, **self.extra, **({} if self.advantages is None else {"advantage": self.advantages})}


def write_completions(out_dir: str | os.PathLike[str], step: int, log: CompletionLog) -> Path:
    """`out_dir/completions/completions_<step:05d>.parquet` (TRL's name), written whole or not at all (`open_output`:
    never through or over a named pipe or a device, one line for a full disk). A fresh run finds none there
    (`jaxcore.runtime.training.check_out_dir_entries`); a resumed one replaces the logs of the steps it runs again."""
    import pandas as pd  # lazy: only a run that logs completions needs pandas (a dependency of datasets)

    path = Path(out_dir) / "completions" / f"completions_{step:05d}.parquet"
    with open_output(path, "wb", overwrite=True, name="train.out_dir's completions log") as handle:
        pd.DataFrame(log.rows(step)).to_parquet(handle)
    return path


def print_completions(log: CompletionLog, step: int, count: int | None) -> None:
    """`count` rows of the log (all with None), drawn at random as TRL draws them, as a table on the console; nothing
    without `rich` (as TRL)."""
    try:
        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
    except ImportError:
        return
    table = Table(show_header=True, header_style="bold white", expand=True)
    columns = ["Prompt", "Completion", *log.rewards, *log.extra,
               *(["Advantage"] if log.advantages is not None else [])]
    for name in columns:
        table.add_column(name, justify="left" if name in ("Prompt", "Completion") else "right")
    indices = list(range(len(log.prompts)))
    if count is not None and count < len(indices):
        indices = sorted(random.Random(step).sample(indices, count))
    for i in indices:
        values = [log.rewards[name][i] for name in log.rewards] + [log.extra[name][i] for name in log.extra] + (
            [log.advantages[i]] if log.advantages is not None else [])
        table.add_row(_text(log.prompts[i]), _text(log.completions[i]), *(_cell(v) for v in values))
    Console().print(Panel(table, expand=False, title=f"Step {step}", border_style="bold white"))


def _cell(value: Any) -> str:
    """A reward, logged value or advantage as a table cell: a number to two decimals, "-" for none."""
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, (int, float)) else str(value)


def _text(value: Any) -> str:
    """A prompt or completion as text: a conversation's messages one per line, `role: content`."""
    if isinstance(value, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value if isinstance(m, dict))
    return str(value)
