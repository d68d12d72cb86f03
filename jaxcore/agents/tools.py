"""Tools as TRL and transformers define them: plain Python functions (or an environment's public methods) with
type hints and a Google-style docstring, described to the model by their JSON schema (`tool_schema`), called by
the model in the `<tool_call>{json}</tool_call>` format (`parse_tool_calls`), their results sent back as `tool`
messages rendered by the chat template.

The call format is that of the Qwen 2.5/3 and Hermes chat templates. A chat template that renders tools in that
format describes them itself (`apply_chat_template(..., tools=...)`); for any other template (SmolLM2, base models,
templates with another tool syntax) the tools and the format are described in the system prompt
(`describe_tools`): one documented default, whatever the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxcore.errors import TaskError
from jaxcore.rewards.types import Example
from jaxcore.rewards.user_functions import ImportedBySpec, import_function, resolved

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)

DEFAULT_TOOL_PROMPT = (
    "You can call tools. To call one, write\n"
    f'{CALL_OPEN}{{"name": <tool name>, "arguments": {{<argument name>: <value>, ...}}}}{CALL_CLOSE}\n'
    "and end your turn; the result comes back in a message from the tool. Answer without a tool call when done. "
    "The tools:\n")


def tool_name(fn: Callable[..., Any]) -> str:
    """The name the model calls a tool by (its `__name__`, as in TRL)."""
    return getattr(fn, "__name__", type(fn).__name__)


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The tool's JSON schema from its signature and Google-style docstring (transformers' `get_json_schema`,
    the one `apply_chat_template(tools=...)` uses); a function it cannot describe is a one-line `TaskError`."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # noqa: BLE001 -- DocstringParsingException, TypeErrors of odd hints: one line
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TaskError(f"tool {tool_name(fn)!r} cannot be described to the model: {text} (tools need type hints "
                        "and a Google-style docstring with an Args: section, as in TRL)") from None


def describe_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The default system-prompt description of the call format and of every tool (one JSON line each)."""
    return DEFAULT_TOOL_PROMPT + "\n".join(json.dumps(s["function"]) for s in schemas)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: `name` and `arguments`, or `error` (why it could not be read) for a malformed one."""

    name: str = ""
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in one assistant turn, in order; a call
    that is not such JSON (or is left unclosed) comes back with `error` set. No call: an empty list."""
    calls = []
    for match in _CALL_RE.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith(CALL_CLOSE):
            calls.append(ToolCall(error=f"malformed tool call: no {CALL_CLOSE} after {CALL_OPEN}"))
            continue
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(ToolCall(error=f"malformed tool call: not JSON ({err.msg} at char {err.pos})"))
            continue
        arguments = data.get("arguments", {}) if isinstance(data, dict) else None
        if isinstance(arguments, str):          # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(arguments, dict):
            calls.append(ToolCall(error='malformed tool call: expected {"name": "...", "arguments": {...}}'))
            continue
        calls.append(ToolCall(data["name"], arguments))
    return calls


def error_result(message: str) -> str:
    """A failed call's result as the model sees it (TRL's `str({"error": ...})`)."""
    return str({"error": message})


class Tool(ImportedBySpec):
    """A standalone tool as a picklable job for the reward worker pool (`rewards.workers`): imported again by
    its spec in a worker, or pickled by reference. Called as a `RewardFn`: `tool(calls, examples)` takes a list
    of argument dicts and returns their results as strings."""

    def __init__(self, fn: Callable[..., Any], spec: str | None = None, root: str | None = None):
        self.name, self.spec, self._fn = tool_name(fn), spec, fn
        self.root = root if root is not None else os.getcwd()

    def __call__(self, calls: Sequence[dict[str, Any]], examples: Sequence[Example] = ()) -> list[str]:
        return [tool_text(self.fn, arguments) for arguments in calls]


def tool_text(fn: Callable[..., Any], arguments: dict[str, Any]) -> str:
    """A tool call's result as the text the model reads: awaited first when the tool is a coroutine function (TRL
    accepts async tools; its coroutine's repr is no result), then `str` (which may raise: the call then failed)."""
    return str(resolved(fn(**arguments)))


def load_tools(specs: Sequence[str | Callable[..., Any]], root: str | os.PathLike[str] | None = None) -> list[Tool]:
    """Tools from "file.py:fn" / "package.module:fn" specs (`rollout.tools`) and callables (`tools=`), each
    checked to have a schema; two tools of one name are a one-line `TaskError`."""
    tools = []
    for spec in specs:
        if isinstance(spec, str):
            try:
                fn = import_function(spec, root)
            except TaskError as err:
                raise TaskError(str(err).replace("reward function", "tool", 1)) from None
            tool = Tool(fn, spec, None if root is None else os.fspath(root))
        elif callable(spec):
            tool = Tool(spec)
        else:
            raise TaskError(f"tools: {spec!r} is neither a callable nor a 'file.py:fn' spec")
        tool_schema(tool.fn)
        tools.append(tool)
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TaskError(f"tools: more than one tool named {twice[0]!r}")
    return tools
