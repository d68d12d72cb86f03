"""An episode as the list of messages TRL hands a reward function for a multi-turn completion: each assistant turn
parsed as TRL's `parse_response` parses it, each tool result as the `tool` message TRL appends
(`GRPOTrainer._tool_call_loop`): `[assistant, tool, ..., assistant, ...]`, so that `completion[-1]["content"]` is
the model's last turn, never text inside a tool's output."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jaxcore.agents.tools import CALL_CLOSE, CALL_OPEN, ToolCall, parse_tool_calls

_CALL_BLOCK_RE = re.compile(re.escape(CALL_OPEN) + r".*?(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


def assistant_message(tokenizer: Any, ids: Sequence[int], prefix_ids: Sequence[int],
                      schemas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One assistant turn (`ids`, its EOS included) after `prefix_ids` (the prompt and the episode before it).

    A tokenizer with a `response_template` parses it as TRL does (`tokenizer.parse_response`, the EOS text cut
    from the content, a missing content "", malformed calls or a failed parse falling back to the decoded text).
    Without one (TRL then runs no tools), the content is the decoded text less its `<tool_call>` blocks and the
    calls jaxcore read from them are `tool_calls` in TRL's form."""
    if getattr(tokenizer, "response_template", None) is not None:
        try:
            return _parsed(tokenizer, list(ids), list(prefix_ids), list(schemas))
        except (ValueError, TypeError):
            return {"role": "assistant", "content": tokenizer.decode(list(ids), skip_special_tokens=True)}
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    calls = [c for c in parse_tool_calls(text) if not c.error]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": _CALL_BLOCK_RE.sub("", text).strip(),
            "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in calls]}


def turn_calls(tokenizer: Any, message: dict[str, Any], ids: Sequence[int]) -> list[ToolCall]:
    """The calls of a turn that ended with EOS (`ids`), as the rollout runs them. With a response template, the
    message's parsed `tool_calls`, as TRL runs them (arguments typed by the tool's schema; a call of a type other
    than "function" an error result; a turn whose calls did not parse has none: the episode ends). Without one,
    jaxcore's `<tool_call>` parser on the turn's text (a malformed call an error result the model reads)."""
    if getattr(tokenizer, "response_template", None) is None:
        return parse_tool_calls(tokenizer.decode(list(ids)[:-1], skip_special_tokens=False))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call["function"] if "function" in call else call
        if call.get("type", "function") != "function":
            calls.append(ToolCall(call.get("name", "unknown"), error=f"Unsupported tool call type: {call['type']}"))
        else:
            calls.append(ToolCall(function["name"], function.get("arguments") or {}))
    return calls


def _parsed(tokenizer: Any, ids: list[int], prefix_ids: list[int], schemas: list[dict[str, Any]]) -> dict[str, Any]:
    parsed = tokenizer.parse_response(ids, prefix=prefix_ids, tools=schemas or None)
    if parsed is None:                      # a turn cut so short that even its content is lost
        raise ValueError("parse_response returned None")
    if isinstance(parsed.get("content"), str) and tokenizer.eos_token:
        parsed["content"] = parsed["content"].removesuffix(tokenizer.eos_token)
    if not parsed.get("content"):
        parsed["content"] = ""
    if "tool_calls" in parsed:
        _check_calls(parsed["tool_calls"])
    return parsed


def _check_calls(tool_calls: Any) -> None:
    """ValueError for calls a template parsed only partly (TRL's `_validate_tool_calls`: the turn is then text);
    arguments left out (a no-argument call) become {}, as there."""
    if tool_calls is None:
        return
    if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
        raise ValueError("tool_calls must be a list of dicts")
    for call in tool_calls:
        function = call["function"] if "function" in call else call
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError("a tool call without a name")
        if function.get("arguments") is None:
            function["arguments"] = {}
