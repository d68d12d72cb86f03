"""Look up rewards and tasks by name: ``get_reward`` and ``get_task``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from jaxcore.rewards.bleu import bleu_reward
from jaxcore.rewards.chess_fen import chess_fen_reward
from jaxcore.rewards.countdown import (
    countdown_answer_reward,
    countdown_format_reward,
    countdown_reward,
)
from jaxcore.rewards.exact_match import digit_match_reward, exact_match_reward
from jaxcore.rewards.file_tasks import FileTask, file_task
from jaxcore.rewards.numeric import numeric_reward
from jaxcore.rewards.tasks import (
    Task,
    addition_task,
    chess_fen_task,
    countdown_task,
    unit_conversion_task,
)
from jaxcore.rewards.types import RewardFn

REWARDS: dict[str, RewardFn] = {
    "bleu": bleu_reward,
    "chess_fen": chess_fen_reward,
    "countdown": countdown_reward,
    "countdown_answer": countdown_answer_reward,
    "countdown_format": countdown_format_reward,
    "digit_match": digit_match_reward,
    "exact_match": exact_match_reward,
    "numeric": numeric_reward,
}

RewardSpec = str | Sequence[str] | Mapping[str, float]


def _check_options(
    kind: str,
    name: str,
    fn: Callable[..., Any],
    options: Mapping[str, Any],
    complete: bool = True,
) -> None:
    """Raise a one-line ValueError if ``fn(**options)`` would not bind."""
    signature = inspect.signature(fn)
    try:
        if complete:
            signature.bind(**options)
        else:
            signature.bind_partial(**options)
    except TypeError as e:
        names = ", ".join(p for p in signature.parameters if p not in ("completions", "examples"))
        raise ValueError(f"{kind} '{name}': {e} (parameters: {names})") from None


def _lookup(kind: str, table: Mapping[str, Any], name: str) -> Any:
    if name not in table:
        raise ValueError(f"unknown {kind} '{name}' (known: {', '.join(sorted(table))})")
    return table[name]


def get_reward(name: str, /, **options: Any) -> RewardFn:
    """The batched reward function ``name``, with keyword ``options`` bound (picklable)."""
    fn = _lookup("reward", REWARDS, name)
    _check_options("reward", name, fn, options, complete=False)
    return partial(fn, **options) if options else fn


def rewards_from_spec(
    spec: RewardSpec, options: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[dict[str, RewardFn], dict[str, float]]:
    """Reward fns and weights from a name, a list of names (weight 1) or ``{name: weight}``."""
    weights = (
        {spec: 1.0}
        if isinstance(spec, str)
        else (dict(spec) if isinstance(spec, Mapping) else dict.fromkeys(spec, 1.0))
    )
    if not weights:
        raise ValueError("at least one reward name is needed")
    options = options or {}
    for name in options:
        if name not in weights:
            raise ValueError(f"reward_options given for '{name}', which is not a chosen reward")
    fns = {name: get_reward(name, **options.get(name, {})) for name in weights}
    return fns, weights


def _file_task(
    path: str | Path,
    reward: RewardSpec = "exact_match",
    reward_options: Mapping[str, Mapping[str, Any]] | None = None,
    **options: Any,
) -> FileTask:
    """File task whose rewards are chosen by name (see :func:`rewards_from_spec`)."""
    fns, weights = rewards_from_spec(reward, reward_options)
    return file_task(path, fns, weights, **options)


def _file_task_signature() -> inspect.Signature:
    """``_file_task``'s own parameters plus ``file_task``'s keyword options (not **options)."""
    own = list(inspect.signature(_file_task).parameters.values())[:3]
    keyword = inspect.signature(file_task).parameters.values()
    return inspect.Signature([*own, *(p for p in keyword if p.kind is p.KEYWORD_ONLY)])


_file_task.__signature__ = _file_task_signature()  # type: ignore[attr-defined]


TASKS: dict[str, Callable[..., Task]] = {
    "addition": addition_task,
    "chess_fen": chess_fen_task,
    "countdown": countdown_task,
    "file": _file_task,
    "unit_conversion": unit_conversion_task,
}


def get_task(name: str, /, **options: Any) -> Task:
    """Build task ``name`` with keyword ``options`` (``"file"`` needs ``path=``)."""
    builder = _lookup("task", TASKS, name)
    _check_options("task", name, builder, options)
    return builder(**options)
