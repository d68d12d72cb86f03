"""Multi-turn rollouts with tools and environments, with TRL's interface (`tools`, `environment_factory`,
`max_tool_calling_iterations`): one engine for ES and GRPO (`engine.run_episodes`)."""

from jaxcore.agents.agent import Agent, build_agent
from jaxcore.agents.engine import run_episodes
from jaxcore.agents.episodes import Episodes
from jaxcore.agents.tools import ToolCall, parse_tool_calls, tool_schema

__all__ = ["Agent", "Episodes", "ToolCall", "build_agent", "parse_tool_calls", "run_episodes", "tool_schema"]
