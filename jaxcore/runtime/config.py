"""The settings the training loop itself reads: which model to load, how rollouts are drawn, and the run's
length, evaluation, checkpoints and logging. Each is declared once here; the ES and GRPO job configs
(`jaxcore.es.config`, `jaxcore.grpo.config`) are composed of these and of their own sections."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Annotated, Any, Literal

from annotated_types import Ge

from jaxcore.config.schema import Checked
from jaxcore.inference.sampling import SamplingConfig

ComputeDtype = Literal["float32", "bfloat16"]
COMPUTE_DTYPES = typing.get_args(ComputeDtype)


@dataclasses.dataclass
class ModelSource(Checked):
    """The `model:` section: the weights a run starts from."""

    path: str = ""                      # HF directory or jaxcore checkpoint
    dtype: ComputeDtype = "float32"     # compute dtype; parameters stay float32
    remat: bool = False
    scan_layers: bool = True            # GRPO trains the blocks under one lax.scan (compile cost flat in depth)


@dataclasses.dataclass
class PromptLimitConfig(Checked):
    """How long a prompt may be (`hf.tokenization.rollout_prompt_limit`): the rollout's prompt limits, also
    those of torchref's RFT engines."""

    max_prompt_length: Annotated[int, Ge(1)] | None = None  # prompt tokens kept (None: the model's positions)
    truncate_prompts: bool = True       # longer prompts: keep the last tokens (warned, counted) or refuse


@dataclasses.dataclass
class RolloutConfig(SamplingConfig, PromptLimitConfig):
    """The `rollout:` section: the sampling settings (temperature, top_k, top_p, min_p), prompts per epoch,
    completions per prompt and prompt limits (max_prompt_length, truncate_prompts). ES rolls out greedily by
    default, GRPO at temperature 1."""

    prompts_per_epoch: Annotated[int, Ge(1)] = 32
    generations_per_prompt: Annotated[int, Ge(1)] = 1
    max_new_tokens: Annotated[int, Ge(1)] = 16
    chat_template: bool = False
    system_prompt: str | None = None
    # extra variables of every chat-template render (TRL's chat_template_kwargs, e.g. {enable_thinking: false})
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Multi-turn rollouts (`jaxcore.agents`; TRL's names): tools as "file.py:fn" / "package.module:fn", an
    # environment class or factory as "file.py:Class" (or {name: spec}, chosen per row by its `environment`
    # column), rounds of tool calls per episode (null: no limit but max_episode_tokens), and the tokens of one
    # episode after its prompt (generated + tool results; each turn generates at most max_new_tokens).
    tools: list[str] = dataclasses.field(default_factory=list)
    environment_factory: str | dict[str, str] | None = None
    max_tool_calling_iterations: Annotated[int, Ge(0)] | None = None
    max_episode_tokens: Annotated[int, Ge(1)] = 256
    # tools / an environment given to the Python API (callables: no config values, so no field; `with_agent`)
    python_agent: typing.ClassVar[bool] = False

    @property
    def multi_turn(self) -> bool:
        """Every rollout row is a multi-turn episode (`jaxcore.agents`): tools or an environment are configured
        here, or were given to the Python API (`with_agent`)."""
        return bool(self.tools or self.environment_factory or self.python_agent)

    @property
    def completion_tokens(self) -> int:
        """The longest completion of a row: a whole episode (`max_episode_tokens`: generated tokens and tool
        results) in a multi-turn rollout, else `max_new_tokens`. TRL's `max_completion_length` (dr_grpo's
        normaliser; the memory planners' completion length)."""
        return self.max_episode_tokens if self.multi_turn else self.max_new_tokens

    @property
    def cache_tokens(self) -> int:
        """KV-cache slots after the prompt: `completion_tokens`, plus one turn's slots in a multi-turn rollout
        (the room `jaxcore.agents`' cache keeps for the rows that wait while others call tools)."""
        return self.completion_tokens + (self.max_new_tokens if self.multi_turn else 0)

    def sampling(self, greedy: bool = False) -> SamplingConfig:
        """The sampling settings as the one object `generate` and the episodes take; `greedy`: temperature 0
        with no filters (held-out evaluation)."""
        if greedy:
            return SamplingConfig(temperature=0.0)
        return SamplingConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingConfig)})

    def with_agent(self) -> RolloutConfig:
        """A copy that is `multi_turn` although its tools / environment come from the Python API."""
        out = copy.copy(self)
        out.python_agent = True
        return out


@dataclasses.dataclass
class TrainConfig(Checked):
    """The `train:` section: the run's length, evaluation, checkpoints, logging and output directory."""

    epochs: Annotated[int, Ge(1)] = 10
    seed: Annotated[int, Ge(0)] = 0
    # a dataset is walked in passes (TRL's RepeatSampler), each pass in an order seeded by (seed, pass); false: the
    # dataset's own order (TRL's shuffle_dataset=False)
    shuffle: bool = True
    out_dir: str = "runs/es"
    eval_every: Annotated[int, Ge(-1)] = 5  # held-out evaluation every N epochs; 0 = only after the last, -1 = never
    eval_prompts: Annotated[int, Ge(1)] = 64
    eval_batch_size: Annotated[int, Ge(1)] = 256
    # completions sampled per held-out prompt with the rollout's settings (TRL's num_generations_eval); 0 = greedy
    eval_samples_per_prompt: Annotated[int, Ge(0)] = 0
    checkpoint_every: Annotated[int, Ge(-1)] = 5  # 0 = only at the end / on SIGTERM; -1 = never (TRL: "no")
    max_to_keep: Annotated[int, Ge(1)] = 3
    max_bad_steps: Annotated[int, Ge(1)] = 3  # consecutive NaN/Inf steps before stopping
    export_hf: bool = True              # write out_dir/final_hf at the end
    # compiled programs kept for later runs (`jaxcore.runtime.compile_cache`): a directory, or "off";
    # the environment variable JAXCORE_COMPILATION_CACHE overrides it
    compilation_cache: str = "~/.cache/jaxcore/xla"
    tensorboard: bool = True
    progress: bool = True
    # every logged rollout's rows (prompt, completion, rewards, advantage) to out_dir/completions/ (TRL's parquet
    # files), and a sample of completions_to_print of them (None: all) printed as a table where rich is installed
    log_completions: bool = False
    completions_to_print: Annotated[int, Ge(0)] | None = None
