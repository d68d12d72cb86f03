"""Rewards, tasks and robust (parallel) scoring for LLM post-training, and the `task:` / `rewards:` config
sections (`config`).

May import: `jaxcore.errors` only (reward worker processes import this package alone, so it stays light).
"""

from jaxcore.rewards.bleu import bleu_reward
from jaxcore.rewards.chess_fen import chess_fen_reward
from jaxcore.rewards.countdown import (
    countdown_answer_reward,
    countdown_format_reward,
    countdown_reward,
)
from jaxcore.rewards.exact_match import digit_match_reward, exact_match_reward
from jaxcore.rewards.file_tasks import FileTask, file_task
from jaxcore.rewards.numeric import numeric_reward, parse_number
from jaxcore.rewards.records import load_records
from jaxcore.rewards.registry import REWARDS, TASKS, get_reward, get_task
from jaxcore.rewards.scoring import Scorer, ScoreResult, ScoringStopped, score
from jaxcore.rewards.tasks import ProceduralTask, Task
from jaxcore.rewards.types import Example, RewardFn, TaskError

__all__ = [
    "REWARDS",
    "TASKS",
    "Example",
    "FileTask",
    "ProceduralTask",
    "RewardFn",
    "ScoreResult",
    "Scorer",
    "ScoringStopped",
    "Task",
    "TaskError",
    "bleu_reward",
    "chess_fen_reward",
    "countdown_answer_reward",
    "countdown_format_reward",
    "countdown_reward",
    "digit_match_reward",
    "exact_match_reward",
    "file_task",
    "get_reward",
    "get_task",
    "load_records",
    "numeric_reward",
    "parse_number",
    "score",
]
