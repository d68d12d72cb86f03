"""transformers' `TrainerCallback`s on a jaxcore run: the hooks a GRPO script commonly overrides (`on_train_begin`,
`on_step_end`, `on_log`, `on_evaluate`, `on_train_end`) called with TRL's arguments (args, state, control, ...)
from the run's events (`runtime.runner.Observer`); `control.should_training_stop` ends the run after that
generation, checkpointed and exported. A callback overriding another hook is refused in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

SUPPORTED = ("on_train_begin", "on_step_end", "on_log", "on_evaluate", "on_train_end")
HOOKS = ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
         "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict",
         "on_save", "on_log", "on_prediction_step", "on_push_begin")


@dataclasses.dataclass
class TrainerControl:
    """transformers' `TrainerControl`: what a callback asks of the loop (jaxcore acts on should_training_stop)."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


def instances(callbacks: Sequence[Any]) -> list[Any]:
    """The callbacks (a class is instantiated, as transformers does), or a one-line ValueError naming a hook
    jaxcore does not call that one of them overrides."""
    made = [cb() if isinstance(cb, type) else cb for cb in callbacks]
    for callback in made:
        overridden = [hook for hook in HOOKS if hook not in SUPPORTED and _overrides(callback, hook)]
        if overridden:
            raise ValueError(f"callback {type(callback).__name__} overrides {', '.join(overridden)}, which jaxcore "
                             f"does not call (it calls {', '.join(SUPPORTED)})")
    return made


def _overrides(callback: Any, hook: str) -> bool:
    """Whether the callback's class defines `hook` itself (not transformers' no-op base)."""
    for cls in type(callback).__mro__:
        if hook in vars(cls):
            return not cls.__module__.startswith("transformers.")
    return False


def observer(callbacks: Sequence[Any], args: Any, state: Any, entry: Callable[[int, dict[str, Any]], dict[str, Any]]
             ) -> Callable[[str, int, dict[str, Any] | None], bool]:
    """The run's observer calling `callbacks`: `state` (a `TrainerState`) follows the run (the observer's `state`:
    the run keeps it current, and the reward functions get it as TRL's trainer_state); `entry(step, metrics)` turns a
    logged step into a `log_history` entry (TRL's names, optimizer steps)."""
    control = TrainerControl()

    def call(hook: str, **kwargs: Any) -> None:
        for callback in callbacks:
            method = getattr(callback, hook, None)
            if method is not None:
                method(args, state, control, **kwargs)

    def observe(event: str, step: int, metrics: dict[str, Any] | None) -> bool:
        if event == "train_end":
            call("on_train_end")
            return False
        logged = entry(step, metrics or {})
        state.global_step, state.epoch = logged["step"], logged["epoch"]
        state.log_history.append(logged)
        if step > 0:
            call("on_step_end")
        evaluated = {k: v for k, v in logged.items() if k.startswith("eval_")}
        if evaluated:
            call("on_evaluate", metrics=evaluated)
        call("on_log", logs=logged)
        return control.should_training_stop

    observe.begin = lambda: call("on_train_begin")            # type: ignore[attr-defined]
    observe.state = state                                       # type: ignore[attr-defined]
    return observe
