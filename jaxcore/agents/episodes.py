"""A batch of finished episodes (`Episodes`): what the episode engine (`jaxcore.agents.engine`) and TRL's
`rollout_func` (`jaxcore.agents.rollout_function`) both hand the training, and the prompts' left padding they
share. Below both."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxcore.inference.generate import GenerationResult
from jaxcore.parallel.rows import gather_rows


@dataclasses.dataclass
class Episodes:
    """A batch of finished episodes (host arrays but `result`, which is placed like a `generate` result)."""

    prompt_ids_BT: np.ndarray
    prompt_mask_BT: np.ndarray
    result: GenerationResult          # completion tokens [B, E] (model + tool tokens), logprobs (0 off the model's)
    model_mask_BE: np.ndarray         # 1 where the model generated the token (TRL's tool_mask)
    env_rewards: dict[str, np.ndarray]   # get_reward per environment class, NaN for other rows and failures
    env_reward_failures: dict[str, int]
    tool_calls_B: np.ndarray
    tool_failures_B: np.ndarray
    turns_B: np.ndarray
    hit_limit_B: np.ndarray           # bool: the episode was cut by max_episode_tokens
    prompts_truncated: int = 0
    # every row's environment instance (None for the rows another process runs); None without environments
    instances: list[Any] | None = None
    # every row's completion as TRL's message list (`jaxcore.agents.messages`; empty for another process's rows)
    messages: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    # every row's prompt with its reset() text, as TRL passes it to the reward functions (own rows; others as given)
    reward_prompts: list[Any] = dataclasses.field(default_factory=list)
    # every row's further reward-function columns (a rollout_func's extra keys); empty: none
    columns: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def scoring(self) -> dict[str, Any]:
        """What `runtime.rollout.score_rows` takes of the episodes besides their tokens: the environments' rewards,
        the instances (TRL's `environments=`), the completions' messages, the prompts as the model saw them and
        further columns."""
        return {"extra": self.env_rewards, "environments": self.instances, "messages": self.messages or None,
                "prompts": self.reward_prompts, "columns": self.columns or None}

    def metrics(self) -> dict[str, float]:
        """Turn/tool/length statistics (TRL's tools/call_frequency and tools/failure_frequency among them)."""
        lengths = np.asarray(gather_rows(self.result.lengths))
        model = self.model_mask_BE.sum(1)
        calls = int(self.tool_calls_B.sum())
        return {"tools/call_frequency": float(self.tool_calls_B.mean()),
                "tools/failure_frequency": float(self.tool_failures_B.sum() / calls) if calls else 0.0,
                "tools/failures": int(self.tool_failures_B.sum()),
                "episodes/turns_mean": float(self.turns_B.mean()), "episodes/turns_max": int(self.turns_B.max()),
                "episodes/length_mean": float(lengths.mean()), "episodes/length_max": int(lengths.max()),
                "episodes/model_tokens_mean": float(model.mean()),
                "episodes/external_tokens_mean": float((lengths - model).mean()),
                "episodes/hit_token_limit": int(self.hit_limit_B.sum()),
                **{f"rewards/{k}/failures": v for k, v in self.env_reward_failures.items()}}


def left_pad(rows: Sequence[Sequence[int]], width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows right-aligned in `width` columns of `pad` ([B, width] int32 ids), and their mask (1 on a row's ids)."""
    ids = np.full((len(rows), width), pad, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return ids, mask
