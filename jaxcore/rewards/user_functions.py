"""Reward functions from user code, with TRL's signature, and reward models (`model:PATH`).

A TRL reward function is any callable

    fn(prompts, completions, completion_ids=..., **columns) -> list[float | None]

where `columns` are every dataset column other than the prompt, as lists with one item per
completion, and None means "not applicable to this sample". For conversational prompts (a list
of {"role", "content"} messages) each completion is passed as [{"role": "assistant", "content": text}],
as TRL does; a multi-turn episode's as its message list, `[assistant, tool, ..., assistant]` (TRL's, whatever
the prompt: the model saw a conversation). TRL's trainer keywords are passed with TRL's meaning: `trainer_state`
(the run's `TrainerState`: optimizer steps taken, `max_steps`, passes over the dataset), `log_metric(name, value)`
(logged as `name` with the step's metrics, the mean of the step's calls, as TRL) and `log_extra(column, values)` (one
value per sample: a column of the completions table). In a multi-turn rollout a function whose signature names
`environments` gets TRL's
`environments=`: the rows' environment instances, one per completion in the completions' order, after their
episodes (called in the trainer's process, where the instances live: `jaxcore.rewards.scoring`).

A spec names the function: `"my_rewards.py:brevity"` (a file; a relative path is relative to the
current directory), `"mypkg.scoring:judge"` (a module; the current directory is searched after the
installed packages, in the main process and in the scoring workers, so a local package works under
the `jaxcore` console script too), `"model:PATH"` (a local `AutoModelForSequenceClassification`
directory, or that directory's path alone, as TRL takes a string; scored in batches with torch, logit 0 as
the reward, as TRL does) or a built-in name (`jaxcore.rewards.REWARDS`). Every reward is a picklable
`RewardFn` that imports its function by spec in whichever process calls it (the scoring workers too);
nothing unpicklable crosses a process boundary.

Checked before training (`task_with_rewards`), each a one-line `RewardFunctionError` naming the
function (exit code 2 from the CLI): an import error, a signature TRL could not call with the task's
columns, a reward model directory without config.json or that does not load, and a wrong count or a
non-number return on a probe call (each function once, on empty completions of two eval examples,
limited to `rewards.timeout_s`). A probe call that raises or times out is only a warning: real functions
may assume a real completion (TRL does not probe at all). Importing or calling user code can never end
the run: a `sys.exit()` in it is an import error or a failed call like any other.
During training a crash, a wrong count or a non-number return is, as for the
built-in rewards, a failure of that chunk: the fallback value, a `rewards/<name>/failures` count and
a one-line warning naming the function.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxcore.errors import RewardFunctionError  # noqa: F401  (re-exported: its old home)
from jaxcore.rewards.config import RewardsConfig
from jaxcore.rewards.registry import REWARDS
from jaxcore.rewards.scoring import takes_environments, to_values
from jaxcore.rewards.types import Example, Reported, RewardFn, TaskError, TrainerState
from jaxcore.rewards.workers import call_with_timeout, one_line

TRL_KEYWORDS = ("prompts", "completions", "completion_ids")
TRAINER_KEYWORDS = ("trainer_state", "log_extra", "log_metric")     # TRL's trainer's own, passed on every call
ENVIRONMENTS = "environments"           # TRL's keyword for a multi-turn rollout's environment instances
logger = logging.getLogger("jaxcore.rewards")


class Completion(str):
    """A completion's text that also carries its token ids (`.ids`, TRL's `completion_ids`) and, for a multi-turn
    episode, its messages (`.messages`: `[assistant, tool, ..., assistant]`, what TRL passes as the completion)."""

    ids: tuple[int, ...] = ()
    messages: list[dict[str, Any]] | None = None

    def __new__(cls, text: str, ids: Sequence[int] = (), messages: list[dict[str, Any]] | None = None
                ) -> Completion:
        obj = super().__new__(cls, text)
        obj.ids = tuple(int(i) for i in ids)
        obj.messages = messages
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return Completion, (str(self), self.ids, self.messages)


def is_conversation(prompt: Any) -> bool:
    """TRL's conversational format: a list of {"role", "content"} messages."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def as_messages(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as chat messages: a conversation's own (copied), a text as one user turn (as TRL renders it)."""
    return [dict(m) for m in prompt] if is_conversation(prompt) else [{"role": "user", "content": str(prompt)}]


def _load_file_module(path: Path) -> Any:
    name = f"jaxcore_user_rewards_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def search_directory(root: str | os.PathLike[str]) -> None:
    """Make modules under `root` importable (after the installed packages, so a local folder named like
    one of them, e.g. `datasets/`, cannot shadow it)."""
    root = os.fspath(root)
    if root not in sys.path:
        sys.path.append(root)
        importlib.invalidate_caches()


def import_function(spec: str, root: str | os.PathLike[str] | None = None) -> Callable[..., Any]:
    """The callable a `file.py:name` or `package.module:name` spec points at (one-line errors).

    `root` (default: the current directory) is where a relative file path starts and where a module
    is looked for when it is not installed."""
    location, _, attr = spec.rpartition(":")
    if not location or not attr:
        raise RewardFunctionError(f"reward function {spec!r}: expected 'file.py:function' or 'module:function'")
    root = Path(os.getcwd() if root is None else root)
    try:
        if location.endswith(".py") or "/" in location:
            path = root / Path(location).expanduser()
            if not path.is_file():
                raise RewardFunctionError(f"reward function {spec!r}: file {location} not found")
            module = _load_file_module(path.absolute())
        else:
            search_directory(root)
            module = importlib.import_module(location)
    except RewardFunctionError:
        raise
    except SystemExit as err:                   # user code must not end the run (silently, with code 0)
        raise RewardFunctionError(f"reward function {spec!r}: importing it called sys.exit({err.code!r})") from None
    except Exception as err:
        raise RewardFunctionError(f"reward function {spec!r}: cannot import it ({one_line(err)})") from err
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardFunctionError(f"reward function {spec!r}: {location} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def check_signature(name: str, fn: Callable[..., Any], columns: Sequence[str]) -> None:
    """Refuse a function that TRL could not call with these dataset columns."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return                                          # builtins and C callables: trust them
    kwargs = {key: [] for key in (*TRL_KEYWORDS, *columns, *TRAINER_KEYWORDS)}
    if ENVIRONMENTS in signature.parameters:
        kwargs[ENVIRONMENTS] = []
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise RewardFunctionError(
            f"reward function {name!r} cannot be called as fn(prompts=, completions=, completion_ids=, "
            f"trainer_state=, log_extra=, log_metric=, **columns) with columns {sorted(columns)}: {err} (give it "
            "**kwargs, as TRL requires)") from None


class ImportedBySpec:
    """A user callable given by import spec ("file.py:fn", "pkg.mod:fn") or as a function: imported lazily from
    `root` (the directory the spec was resolved against) and pickled by its spec, so a worker process imports
    it again rather than unpickling a closure. Reward functions and tools are both this."""

    spec: str | None
    root: str
    _fn: Callable[..., Any] | None

    @property
    def fn(self) -> Callable[..., Any]:
        if self._fn is None:
            self._fn = import_function(self.spec, self.root)
        return self._fn

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.spec:
            state["_fn"] = None                                     # imported again by spec
        return state


class TRLReward(ImportedBySpec):
    """A TRL-signature function as a picklable `RewardFn` (imported by spec, or pickled by reference).

    `columns` are the task-wide column names: each is passed on every call, None for the rows that lack
    it, even when no row of a chunk has it (as a `datasets.Dataset` would). TRL's trainer keywords override a column
    of their name, as in TRL."""

    takes_trainer_state = True          # the Scorer passes the run's `TrainerState` (TRL's trainer_state=)

    def __init__(self, name: str, spec: str | None = None, fn: Callable[..., Any] | None = None,
                 columns: Sequence[str] = (), root: str | None = None):
        if (spec is None) == (fn is None):
            raise ValueError("give exactly one of spec or fn")
        self.name, self.spec, self._fn = name, spec, fn
        self.columns = tuple(c for c in columns if c not in (*TRL_KEYWORDS, *TRAINER_KEYWORDS))
        self.root = root if root is not None else os.getcwd()       # where the spec was resolved

    @property
    def takes_environments(self) -> bool:
        """The function names an `environments` parameter (TRL's keyword): it reads the rollout's instances."""
        try:
            return ENVIRONMENTS in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def __call__(self, completions: Sequence[str], examples: Sequence[Example],
                 environments: Sequence[Any] | None = None, trainer_state: TrainerState | None = None) -> Any:
        """The function on copies of the rows (one that edits its `prompts` or columns in place must not change
        the dataset: the next epoch, a resumed run and a worker process would see other data), awaited when it is
        a coroutine function (TRL accepts async reward functions), with TRL's trainer keywords (`trainer_state`:
        the run's, or a fresh one). Its values, as a `Reported` when it logged metrics or columns."""
        prompts = _copied([e.prompt for e in examples])
        texts = [_copied(as_trl_completion(c, e)) for c, e in zip(completions, examples)]
        skipped = (*TRL_KEYWORDS, *TRAINER_KEYWORDS)
        keys = dict.fromkeys([*self.columns, *(k for e in examples for k in e.columns if k not in skipped)])
        columns = _copied({key: [e.columns.get(key) for e in examples] for key in keys})
        ids = [list(getattr(c, "ids", ())) for c in completions]
        if environments is not None:
            columns[ENVIRONMENTS] = list(environments)          # live instances, read in place (as TRL passes them)
        metrics: dict[str, list[float]] = {}
        extra: dict[str, list[Any]] = {}

        def log_metric(name: str, value: float) -> None:
            metrics.setdefault(name, []).append(float(value))

        def log_extra(column: str, values: list[Any]) -> None:
            extra.setdefault(column, []).extend(values)

        values = as_listed(resolved(self.fn(prompts=prompts, completions=texts, completion_ids=ids, **columns,
                                            trainer_state=trainer_state if trainer_state is not None
                                            else TrainerState(), log_extra=log_extra, log_metric=log_metric)))
        if (metrics or extra) and not isinstance(values, (str, bytes, Mapping)):
            try:
                return Reported(values, metrics, extra)
            except TypeError:                       # not a sequence: `to_values` says what it is
                pass
        return values


def as_trl_completion(completion: str, example: Example) -> str | list[dict[str, Any]]:
    """A completion as TRL passes it to a reward function: a multi-turn episode's message list; for a
    conversational prompt `[{"role": "assistant", "content": text}]`; else the text."""
    messages = getattr(completion, "messages", None)
    if messages is not None:
        return messages
    return [{"role": "assistant", "content": str(completion)}] if is_conversation(example.prompt) else str(completion)


def _copied(rows: Any) -> Any:
    """A deep copy of what a user function receives; the rows themselves where a value cannot be copied (a lock, a
    client held in a Python API dataset's column)."""
    try:
        return copy.deepcopy(rows)
    except Exception:  # noqa: BLE001 -- any failure to copy: pass the rows as TRL would have them
        return rows


def as_listed(values: Any) -> Any:
    """What a reward function returned, as TRL reads it (`[r if r is not None else nan for r in output]`, then
    `torch.tensor`): a generator or other iterator as the list of its values, a 1-d torch tensor or numpy array as
    its list of numbers; anything else as it is (`to_values` says what is wrong with it)."""
    if isinstance(values, Iterator):
        return list(values)
    if getattr(values, "ndim", None) == 1 and callable(getattr(values, "tolist", None)):
        return values.tolist()
    return values


def resolved(value: Any) -> Any:
    """`value`, or what it resolves to when user code returned an awaitable (an async reward function or tool, as
    TRL accepts them), run to completion on a fresh event loop."""
    return asyncio.run(_awaited(value)) if inspect.isawaitable(value) else value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class RewardModel:
    """`model:PATH`: a local sequence-classification model; reward = logit 0 of prompt + completion (TRL)."""

    def __init__(self, path: str | os.PathLike[str], batch_size: int = 32, *,
                 chat_template_kwargs: dict[str, Any] | None = None):
        self.path, self.batch_size = str(Path(path).expanduser().absolute()), batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._loaded: tuple[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "batch_size": self.batch_size, "chat_template_kwargs": self.chat_template_kwargs,
                "_loaded": None}

    def load(self) -> tuple[Any, Any]:
        """(model, tokenizer), loaded once per process; a missing or unloadable directory is a one-line error."""
        if self._loaded is None:
            if not (Path(self.path) / "config.json").is_file():
                raise RewardFunctionError(f"reward model {self.path}: no config.json there (expected a local "
                                          "AutoModelForSequenceClassification directory)")
            try:
                # lazy: transformers loads only when a reward model is used (keeps jaxcore.rewards light)
                from transformers import AutoModelForSequenceClassification, AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                model, info = AutoModelForSequenceClassification.from_pretrained(
                    self.path, local_files_only=True, output_loading_info=True)
            except Exception as err:
                raise RewardFunctionError(f"reward model {self.path}: cannot load it ({one_line(err)})") from err
            if info["missing_keys"]:          # e.g. a causal LM: its score head would be random, its rewards noise
                architectures = ", ".join(model.config.architectures or ["no architectures in config.json"])
                raise RewardFunctionError(f"reward model {self.path}: not a trained sequence classifier "
                                          f"({architectures}; {sorted(info['missing_keys'])[0]} would be randomly "
                                          "initialised)")
            model.eval()
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tokenizer.pad_token_id
            self._loaded = (model, tokenizer)
        return self._loaded

    def texts(self, completions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        """prompt + completion; conversations rendered with the reward model's chat template, as TRL."""
        _, tokenizer = self.load()
        out = []
        for completion, example in zip(completions, examples):
            trl_completion = as_trl_completion(completion, example)
            if isinstance(trl_completion, list):
                out.append(tokenizer.apply_chat_template([*as_messages(example.prompt), *trl_completion],
                                                         tokenize=False, **self.chat_template_kwargs))
            else:
                out.append(example.prompt + trl_completion)
        return out

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        import torch  # lazy: only a reward model needs torch (keeps jaxcore.rewards light)

        model, tokenizer = self.load()
        texts, rewards = self.texts(completions, examples), []
        for start in range(0, len(texts), self.batch_size):
            batch = tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                              padding_side="right", add_special_tokens=False)
            with torch.inference_mode():
                rewards.extend(model(**batch).logits[:, 0].float().tolist())
        return rewards


def function_name(spec: str | Callable[..., Any]) -> str:
    """The metric name of a reward: the function's name (a `functools.partial`'s wrapped function's, a callable
    instance's class name: TRL's `get_callable_name`), or `model:<dir name>`."""
    if callable(spec):
        while isinstance(spec, functools.partial):
            spec = spec.func
        return getattr(spec, "__name__", type(spec).__name__)
    if spec.startswith("model:"):
        return f"model:{Path(spec[6:]).name}"
    if is_reward_model_directory(spec):
        return Path(spec).name                              # TRL names a reward model by its name_or_path's last part
    return spec.rpartition(":")[2] if ":" in spec else spec


def is_reward_model_directory(spec: str) -> bool:
    """A spec naming a local directory and not a built-in reward: a reward model, as TRL reads a string in
    `reward_funcs` (the same as `model:DIR`)."""
    return spec not in REWARDS and ":" not in spec and Path(spec).is_dir()


def resolve_rewards(functions: Sequence[str | Callable[..., Any]], weights: Sequence[float] | None = None,
                    columns: Sequence[str] = (), *, chat_template_kwargs: dict[str, Any] | None = None,
                    columns_known: bool = True) -> tuple[dict[str, RewardFn], dict[str, float]]:
    """Reward fns and weights from specs or callables (file/module specs, `model:PATH` rendering conversations
    with `chat_template_kwargs`, built-in names)."""
    if not functions:
        raise RewardFunctionError("rewards.functions is empty")
    if weights is not None and len(weights) != len(functions):
        raise RewardFunctionError(f"rewards.weights has {len(weights)} entries for {len(functions)} functions")
    fns: dict[str, RewardFn] = {}
    for entry in functions:
        name = function_name(entry)
        while name in fns:
            name += "_"
        if callable(entry):
            if columns_known:
                check_signature(name, entry, columns)
            fns[name] = TRLReward(name, fn=entry, columns=columns)
        elif not isinstance(entry, str):
            raise RewardFunctionError(f"reward function {entry!r}: expected a name, a spec or a callable")
        elif entry.startswith("model:") or is_reward_model_directory(entry):
            reward_model = RewardModel(entry.removeprefix("model:"), chat_template_kwargs=chat_template_kwargs)
            reward_model.load()                             # a wrong path fails now, not as fallback 0s
            fns[name] = reward_model
        elif ":" in entry:
            root = os.getcwd()
            function = import_function(entry, root)
            if columns_known:
                check_signature(entry, function, columns)
            fns[name] = TRLReward(name, spec=entry, columns=columns, root=root)
        elif entry in REWARDS:
            fns[name] = REWARDS[entry]
        else:
            raise RewardFunctionError(f"reward function {entry!r}: not a built-in reward ({', '.join(sorted(REWARDS))})"
                                      ", not a 'file.py:function' or 'module:function' spec and not a reward model "
                                      "directory ('model:DIR' or the directory itself)")
    values = [1.0] * len(fns) if weights is None else [float(w) for w in weights]
    return fns, dict(zip(fns, values))


def probe_rewards(fns: dict[str, RewardFn], examples: Sequence[Example],
                  timeout_s: float | None = RewardsConfig.timeout_s) -> None:
    """Call each user function and reward model once on empty completions, each under `timeout_s`
    (`call_with_timeout`): a wrong count or a non-number return is a one-line `RewardFunctionError` before any
    training starts. A crash or a timeout is only logged (one line): a real function may assume a real
    completion (`re.search(...).group(1)`). A function that reads `environments` is not probed (no episode has
    run yet)."""
    completions = [Completion("") for _ in examples]
    for name, fn in fns.items():
        if not isinstance(fn, (TRLReward, RewardModel)) or takes_environments(fn):
            continue                        # built-in rewards are trusted; episodes' environments are not there yet
        try:
            ok, output = call_with_timeout(_raising_own_errors(fn), (completions, list(examples)), timeout_s)
        except _OwnError as err:
            raise err.args[0] from None
        if not ok:
            verb = "did not return" if output.startswith("timed out") else "raised"
            logger.warning("reward function %r %s on a probe call with empty completions (%s); going on: "
                           "during training a failure gets the fallback and is counted", name, verb, output)
            continue
        try:
            to_values(output, len(examples))
        except ValueError as err:
            raise RewardFunctionError(f"reward function {name!r} {err} (probe call on {len(examples)} "
                                      "empty completions)") from None


class _OwnError(BaseException):
    """Carries a `RewardFunctionError` out of `call_with_timeout` (which turns other errors into outcomes)."""


def _raising_own_errors(fn: RewardFn) -> Callable[..., Any]:
    """`fn`, with its `RewardFunctionError`s (a reward model that does not load) wrapped to pass through."""
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except RewardFunctionError as err:
            raise _OwnError(err) from None
    return call


def task_columns(task: Any, examples: Sequence[Example] = ()) -> list[str]:
    """Every column of the task's data (train and eval of a file/dataset task), else of `examples`."""
    pools = [getattr(task, split, None) for split in ("train", "eval")]
    rows = [e for pool in pools if isinstance(pool, (tuple, list)) for e in pool] or list(examples)
    return list(dict.fromkeys(key for example in rows for key in example.columns))


def task_with_rewards(task: Any, functions: Sequence[str | Callable[..., Any]],
                      weights: Sequence[float] | None, timeout_s: float | None = RewardsConfig.timeout_s, *,
                      chat_template_kwargs: dict[str, Any] | None = None, columns_known: bool = True) -> Any:
    """`task` scored by `functions` instead of its own rewards, after the checks of the module doc (each probe
    call limited to `timeout_s`; `chat_template_kwargs` for a reward model's chat template). Without
    `columns_known` (a rollout_func adds columns only when it runs) a function's signature is not checked against
    the data's columns, nor probed."""
    try:
        probe = task.examples("eval", 2, 0)
    except TaskError:
        probe = task.examples("eval", 1, 0)
    fns, fn_weights = resolve_rewards(functions, weights, task_columns(task, probe),
                                      chat_template_kwargs=chat_template_kwargs, columns_known=columns_known)
    if columns_known:
        probe_rewards(fns, probe, timeout_s)
    return dataclasses.replace(task, reward_fns=fns, reward_weights=fn_weights)


RewardSpecs = Sequence[str | Callable[..., Any]]
__all__ = ["Completion", "RewardFunctionError", "RewardModel", "TRLReward", "is_conversation", "probe_rewards",
           "resolve_rewards", "task_columns", "task_with_rewards"]
