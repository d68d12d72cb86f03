"""Environments as TRL defines them (`environment_factory`): a callable (or a `{name: callable}` mapping, the
name chosen per row by its `environment` column) that builds an instance with a `reset(**row)` method (its
return value, when a string, is appended to the row's last user message), public methods that are its tools, and
optionally `get_reward()` scoring the finished episode (an extra reward source, weight 1, named after the class).

Every rollout row gets its own instance (instances are pooled and reset, as in TRL: built once, reset often), so
rows never share state: for ES every population member's rows hold their own instances. Over several processes
a row's instance lives on the process that owns the row (`jaxcore.agents.engine`).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxcore.agents.tools import tool_schema
from jaxcore.errors import TaskError
from jaxcore.rewards.types import Example
from jaxcore.rewards.user_functions import import_function
from jaxcore.rewards.workers import one_line

log = logging.getLogger(__name__)
Factory = Callable[[], Any]
ENVIRONMENT_COLUMN = "environment"
RESERVED = ("reset", "get_reward")


def public_methods(instance: Any) -> list[Callable[..., Any]]:
    """An instance's tools: its public methods but `reset` and `get_reward` (listed on the class, as TRL does, so
    properties are not evaluated)."""
    return [getattr(instance, name) for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")]


def resolve_factories(factory: Any, root: str | os.PathLike[str] | None = None) -> dict[str | None, Factory]:
    """`environment_factory` (a callable, a "file.py:Class" spec, or a mapping of names to either) as
    {name: callable}; a single factory is named None (every row uses it)."""
    def one(value: Any, where: str) -> Factory:
        if isinstance(value, str):
            try:
                return import_function(value, root)
            except TaskError as err:
                raise TaskError(str(err).replace("reward function", where, 1)) from None
        if not callable(value):
            raise TaskError(f"{where}: {value!r} is neither a callable nor a 'file.py:Class' spec")
        return value

    if isinstance(factory, Mapping):
        if not factory:
            raise TaskError("environment_factory: the mapping of environments is empty")
        return {str(name): one(value, f"environment {name!r}") for name, value in factory.items()}
    return {None: one(factory, "environment_factory")}


class Environments:
    """The run's environment factories, their tools and reward sources, and the pool of instances."""

    def __init__(self, factories: Mapping[str | None, Factory]):
        self.factories = dict(factories)
        self.pools: dict[str | None, list[Any]] = {}
        self.reward_classes: dict[str, type] = {}       # class name -> class, for classes with get_reward
        self.schemas: dict[str | None, list[dict[str, Any]]] = {}
        self.classes: dict[str | None, type] = {}        # name -> the class its factory builds
        for name, factory in self.factories.items():
            where = f"environment {name!r}" if name is not None else "environment_factory"
            try:
                instance = factory()
            except Exception as err:  # noqa: BLE001 -- the user's constructor: one line, before any work
                raise TaskError(f"{where}: building an instance raised {one_line(err)}") from None
            cls = self.classes[name] = type(instance)
            if not callable(getattr(instance, "reset", None)):
                raise TaskError(f"{where}: {cls.__name__} has no reset method (TRL's environments define "
                                "reset(**row))")
            self.schemas[name] = [tool_schema(m) for m in public_methods(instance)]
            if callable(getattr(instance, "get_reward", None)) and cls not in self.reward_classes.values():
                if self.reward_classes.get(cls.__name__, cls) is not cls:
                    raise TaskError(f"two environment classes named {cls.__name__}: their rewards would share a name")
                self.reward_classes[cls.__name__] = cls
            self.pools[name] = [instance]

    @property
    def named(self) -> bool:
        """Several environments, chosen per row by its `environment` column."""
        return None not in self.factories

    def name_of(self, example: Example) -> str | None:
        """The environment a row selects (None with a single factory)."""
        if not self.named:
            return None
        name = example.columns.get(ENVIRONMENT_COLUMN)
        if name not in self.factories:
            raise TaskError(f"a row has {ENVIRONMENT_COLUMN}={name!r}, not one of the environments "
                            f"{sorted(self.factories)}")
        return name

    def instances(self, examples: Sequence[Example], rows: Sequence[bool] | None = None) -> list[Any]:
        """One instance per row, drawn from the pool (grown when a batch needs more); with `rows` (a flag per
        example), only for the flagged rows (None elsewhere: another process runs them; and where building a new
        instance raised, logged: that row's episode fails, counted). Every row's environment name is checked, so
        that a bad one fails on every process alike."""
        cursor: dict[str | None, int] = {}
        out = []
        for i, example in enumerate(examples):
            name = self.name_of(example)
            if rows is not None and not rows[i]:
                out.append(None)
                continue
            pool, index = self.pools[name], cursor.get(name, 0)
            if index == len(pool):
                try:
                    pool.append(self.factories[name]())
                except Exception as err:  # noqa: BLE001 -- the user's constructor: this row's episode fails
                    log.warning("building an instance of %s raised %s: row %d's episode fails",
                                self.classes[name].__name__, one_line(err), i)
                    out.append(None)
                    continue
            cursor[name] = index + 1
            out.append(pool[index])
        return out

    def drop(self, instance: Any) -> None:
        """Never hand out `instance` again (its reset or a tool call hung or raised: its state is unknown)."""
        self.pools = {name: [i for i in pool if i is not instance] for name, pool in self.pools.items()}


def reset_kwargs(example: Example, named: bool) -> dict[str, Any]:
    """The row `reset(**row)` gets, as TRL passes it: "prompt" and every other column (the reference answer as
    "answer" when the data has no such column); with several environments, without the `environment` column."""
    row = {"prompt": example.prompt, **example.columns}
    if example.answer is not None:
        row.setdefault("answer", example.answer)
    if named:
        row.pop(ENVIRONMENT_COLUMN, None)
    return row
