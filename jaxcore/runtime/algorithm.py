"""What the training loop asks of an algorithm (ES, GRPO): the `Algorithm` base class, and `StepResult`.

The runtime knows algorithms only through this class: before any weight is read it asks the algorithm's
class for its name, its memory plan, the mesh setting that must divide the devices and where the weights
should be loaded; during the run it asks the instance for a training step, its checkpoint state, the model
to evaluate and the model to export. The runtime imports neither `jaxcore.es` nor `jaxcore.grpo`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from jaxcore.runtime.evaluation import evaluate
from jaxcore.runtime.memory import MemoryPlan


@dataclasses.dataclass
class StepResult:
    metrics: dict[str, Any]
    skipped: bool = False          # NaN/Inf somewhere: nothing was applied
    reason: str = ""
    completions: Any = None        # the rollout's rows (`runtime.completions.CompletionLog`) with train.log_completions


class Algorithm(abc.ABC):
    """A training algorithm on the shared runtime; built as
    `cls(model, tokenizer, cfg, eos_token_ids=..., rollout=...)`."""

    name: ClassVar[str]            # "es" | "grpo": stored in checkpoints, so a resume never crosses algorithms
    eval_sharding: Any = None      # the row sharding held-out evaluation runs with (None: default placement)
    rollout: Any = None            # the run's `runtime.rollout.Rollout`: training and evaluation roll out with it

    # -- asked of the class, before the model is loaded -------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def load_targets(cls, cfg: Any) -> dict[str, Any]:
        """Keyword arguments for `load_any` that load each weight straight where the algorithm keeps it."""

    @classmethod
    @abc.abstractmethod
    def mesh_divisor(cls, cfg: Any) -> tuple[str, int]:
        """The setting that must divide the device count, as (dotted key, value)."""

    @classmethod
    @abc.abstractmethod
    def memory_plan(cls, cfg: Any, model_cfg: Any, *, devices: int, device_memory: float | None = None,
                    prompt_tokens: int | None = None, platform: str | None = None, **sizes: int) -> MemoryPlan:
        """The per-device memory plan of this job for `platform` (default: JAX's default backend; `sizes` override
        the configured population or prompts)."""

    @classmethod
    def layout_refusal(cls, cfg: Any, devices: int) -> str | None:
        """Why the algorithm refuses to lay this job out over `devices` devices (rows or population over its
        mesh), else None: the run's own refusal, which `jaxcore plan` says before a run."""
        return None

    @classmethod
    def device_memory(cls, cfg: Any) -> str:
        """A configured per-device memory to plan against ("" = the accelerator's own limit)."""
        return ""

    @classmethod
    def largest_fitting(cls, cfg: Any, model_cfg: Any, *, devices: int, device_memory: float | None = None,
                        prompt_tokens: int | None = None, platform: str | None = None) -> tuple[str, int] | None:
        """The setting `jaxcore plan` sizes to the device memory, as it names it, and its largest value whose
        memory plan fits (0 if none); None when the algorithm sizes nothing."""
        return None

    # -- asked of the instance, during the run -------------------------------------------------------

    model: Any

    @abc.abstractmethod
    def train_step(self, epoch: int, examples: list[Any], scorer: Any) -> StepResult:
        """Roll out `examples`, score them with `scorer` and update the model once (one epoch)."""

    @abc.abstractmethod
    def checkpoint_state(self) -> Any:
        """The pytree a checkpoint stores (and `restore_state` takes back)."""

    @abc.abstractmethod
    def restore_state(self, state: Any) -> None:
        """Continue from a checkpoint's state."""

    def eval_model(self) -> Any:
        """The model held-out evaluation generates with."""
        return self.model

    def evaluate(self, examples: list[Any], scorer: Any, *, batch_size: int, samples_per_prompt: int = 0
                 ) -> dict[str, Any]:
        """Held-out evaluation of `eval_model` on `examples` (`jaxcore.runtime.evaluation.evaluate`), on every
        process alike (asynchronous GRPO over two processes: one generates, both score)."""
        return evaluate(self.eval_model(), examples, scorer, self.rollout, batch_size=batch_size,
                        row_sharding=self.eval_sharding, samples_per_prompt=samples_per_prompt)

    def prepare(self, upcoming: list[list[Any]]) -> None:
        """Make, beside the current work, the programs the epochs to come will need: `upcoming` holds their
        examples (what `train_step` will get), in order. Called before the first epoch with the first few
        epochs' examples, then before each epoch with the next one's. Nothing by default."""
        return None

    def examples_ahead(self, draw: Any) -> None:
        """Given once before the first epoch: `draw(epoch)` is epoch `epoch`'s examples (what `train_step` will get
        then), for any epoch of the run, called on the main thread. For an algorithm that works ahead of the epoch
        it trains (asynchronous GRPO generates later epochs' batches while one trains). Nothing by default."""
        return None

    def close(self) -> None:
        """Release what the algorithm runs beside training (e.g. a thread making programs ahead of time); the runner
        calls it once the run ends, however it ends."""
        return None

    def export_model(self) -> Any:
        """The model `save_hf` writes to out_dir/final_hf."""
        return self.model

    def export_extra(self, out_dir: str, base_model_path: str) -> dict[str, str]:
        """Anything written beside final_hf (e.g. a LoRA adapter), as {summary key: path}."""
        return {}
