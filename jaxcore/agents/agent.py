"""A run's tools and environments (`Agent`, built by `build_agent` from the rollout settings and the Python API's
arguments): the prompt each row starts from (the chat template with the tools described natively or in the system
prompt, the environment's reset text appended as TRL does), the tool-result suffixes, the tools a row may call.
`jaxcore.agents.engine` runs the episodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxcore.agents.calls import CallRunner
from jaxcore.agents.environments import Environments, public_methods, resolve_factories
from jaxcore.agents.rollout_function import RolloutFunction
from jaxcore.agents.tools import CALL_OPEN, Tool, describe_tools, load_tools, tool_name, tool_schema
from jaxcore.errors import TaskError
from jaxcore.hf.tokenization import render_chat
from jaxcore.rewards.types import Example
from jaxcore.rewards.user_functions import as_messages, is_conversation


class Agent:
    """The tools and environments of a run, and the limits of an episode (`rollout.max_tool_calling_iterations`,
    `rollout.max_episode_tokens`); tool calls get `timeout_s` and, with `num_workers > 0`, worker processes."""

    def __init__(self, tools: Sequence[Tool] = (), environments: Environments | None = None, *,
                 max_iterations: int | None = None, max_episode_tokens: int = 256, timeout_s: float = 30.0,
                 num_workers: int = 0):
        if not tools and environments is None:
            raise TaskError("a multi-turn rollout needs tools or an environment_factory")
        if max_iterations is not None and max_iterations < 0:
            raise TaskError(f"rollout.max_tool_calling_iterations must be >= 0 or null, got {max_iterations}")
        self.tools, self.environments = list(tools), environments
        for name, instances in (environments.pools if environments is not None else {}).items():
            shared = sorted({t.name for t in self.tools} & {tool_name(m) for m in public_methods(instances[0])})
            if shared:          # TRL and jaxcore would both call the method only: the tool would never run
                where = f"environment {name!r}" if name is not None else "the environment_factory's environment"
                raise TaskError(f"tools: {shared[0]!r} is both a standalone tool and a method of {where} "
                                f"({type(instances[0]).__name__}); rename one")
        self.max_iterations, self.max_episode_tokens = max_iterations, max_episode_tokens
        self.timeout_s = timeout_s
        self.runner = CallRunner(self.tools, timeout_s, num_workers)
        self._native: dict[int, bool] = {}
        self._longest_token: dict[int, int] = {}
        self._schemas: dict[type, list[dict[str, Any]]] = {}

    def close(self) -> None:
        self.runner.close()

    @property
    def reward_names(self) -> list[str]:
        """The extra reward sources: the environment classes that define `get_reward`."""
        return list(self.environments.reward_classes) if self.environments is not None else []

    # -- prompts ---------------------------------------------------------------------------------------

    def schemas(self, instance: Any) -> list[dict[str, Any]]:
        """The JSON schemas of the tools a row may call (the standalone ones, then its environment's), made once
        per environment class (its public methods are the class's: every instance has the same)."""
        if type(instance) not in self._schemas:
            methods = public_methods(instance) if instance is not None else []
            self._schemas[type(instance)] = [tool_schema(t.fn) for t in self.tools] + [tool_schema(m) for m in methods]
        return self._schemas[type(instance)]

    def native_format(self, tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
        """Whether the chat template renders tools in the `<tool_call>` format itself."""
        if id(tokenizer) not in self._native:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=schemas[:1],
                                                 tokenize=False, add_generation_prompt=True)
            self._native[id(tokenizer)] = CALL_OPEN in text
        return self._native[id(tokenizer)]

    def prompt_text(self, tokenizer: Any, example: Example, observation: Any, instance: Any,
                    system: str | None) -> str:
        """The row's prompt through the chat template: the environment's reset text appended to the last user
        message (as TRL does), the tools described natively or in the system prompt."""
        if not getattr(tokenizer, "chat_template", None):
            raise TaskError("tools and environments need a tokenizer with a chat_template (tool messages are turns)")
        messages = as_messages(observed_prompt(example.prompt, observation))
        schemas = self.schemas(instance)
        native = bool(schemas) and self.native_format(tokenizer, schemas)
        if schemas and not native:
            system = describe_tools(schemas) if not system else f"{system}\n\n{describe_tools(schemas)}"
        if system and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": system}, *messages]
        return render_chat(tokenizer, messages, tools=schemas if native else None, tokenize=False,
                           add_generation_prompt=True)

    @staticmethod
    def suffix_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
        """The token ids that follow an assistant turn's EOS when `messages` (tool results) answer it, up to the
        next assistant header: TRL's `_get_tool_suffix_ids` (a dummy conversation rendered with and without them,
        the prefix cut after its last EOS)."""
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "",
                  "tool_calls": [{"type": "function", "function": {"name": messages[0]["name"], "arguments": {}}}]}]
        prefix = tokenizer.apply_chat_template(dummy, tokenize=True, add_generation_prompt=False, return_dict=False)
        full = tokenizer.apply_chat_template(dummy + messages, tokenize=True, add_generation_prompt=True,
                                             return_dict=False)
        eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
        if eos:
            prefix = prefix[:eos[-1] + 1]
        if list(full[:len(prefix)]) != list(prefix):
            raise TaskError("the chat template is not prefix-preserving: tool results cannot be appended to a turn")
        return list(full[len(prefix):])

    def surely_longer(self, tokenizer: Any, messages: list[dict[str, str]], room: int) -> bool:
        """Whether tool messages surely take more than `room` tokens, known from their UTF-8 bytes (no token holds
        more than 4 bytes per character of the tokenizer's longest token) without templating and tokenizing them:
        a megabytes-long result ends its episode at once."""
        if id(tokenizer) not in self._longest_token:
            self._longest_token[id(tokenizer)] = max((len(t) for t in tokenizer.get_vocab()), default=1)
        size = sum(len(str(m["content"]).encode("utf-8", "surrogatepass")) for m in messages)
        return size > 4 * self._longest_token[id(tokenizer)] * room

    def tools_of(self, instance: Any) -> dict[str, Any]:
        """The tools a row may call, by name: the standalone ones and its environment's methods."""
        out: dict[str, Any] = {t.name: t for t in self.tools}
        if instance is not None:
            out.update({tool_name(m): m for m in public_methods(instance)})
        return out


def observed_prompt(prompt: Any, observation: Any) -> Any:
    """A row's prompt with its environment's `reset()` text appended to the last user message, as TRL rebuilds it
    (the prompt the model sees and the reward functions get); unchanged for any other observation."""
    if not isinstance(observation, str):
        return prompt
    if not is_conversation(prompt):
        return str(prompt) + observation
    return [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]


def build_agent(rollout: Any, rewards: Any, *, tools: Sequence[Any] = (), environment_factory: Any = None,
                root: str | None = None, rollout_func: Any = None, owner: Any = None) -> Agent | RolloutFunction | None:
    """The run's `Agent` from the rollout section (`tools`, `environment_factory` specs) and the Python API's
    `tools=` / `environment_factory=`, or its `rollout_func` (TRL's; `owner` is the trainer it gets); None for a
    single-turn run (nothing configured)."""
    specs = [*rollout.tools, *tools]
    if rollout_func is not None:
        if specs or environment_factory is not None or rollout.environment_factory:
            raise TaskError("rollout_func generates every completion itself: it takes no tools or environment_factory")
        return RolloutFunction(rollout_func, owner, max_episode_tokens=rollout.max_episode_tokens)
    factory = environment_factory if environment_factory is not None else rollout.environment_factory
    if not specs and factory is None:
        return None
    environments = Environments(resolve_factories(factory, root)) if factory is not None else None
    if rollout.max_episode_tokens < rollout.max_new_tokens:
        raise TaskError(f"rollout.max_episode_tokens={rollout.max_episode_tokens} is below rollout.max_new_tokens="
                        f"{rollout.max_new_tokens}: one turn would not fit an episode")
    return Agent(load_tools(specs, root), environments, max_iterations=rollout.max_tool_calling_iterations,
                 max_episode_tokens=rollout.max_episode_tokens, timeout_s=rewards.timeout_s,
                 num_workers=rewards.num_workers)
