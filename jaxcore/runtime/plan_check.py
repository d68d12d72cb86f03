"""The start-up check that refuses a run which cannot fit its devices before any weight is read (the plan
itself is the algorithm's: `Algorithm.memory_plan`), and the helpers `jaxcore plan` shares with it."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxcore.errors import UserError
from jaxcore.hf.convert import read_json_config
from jaxcore.hf.model_checkpoint import read_meta
from jaxcore.model.config import ConfigError, ModelConfig
from jaxcore.model.families import config_from_hf
from jaxcore.runtime.algorithm import Algorithm
from jaxcore.runtime.memory import DEFAULT_PROMPT_TOKENS, refusal
from jaxcore.runtime.rollout import Rollout

PROMPT_SAMPLE = 64            # training prompts measured for the length to plan for


def parse_bytes(text: str) -> float:
    """'40GB', '40GiB', '4e10' -> bytes."""
    units = {"gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6, "kib": 2**10, "kb": 1e3, "b": 1}
    lowered = text.strip().lower()
    number, scale = lowered, 1.0
    for unit, unit_scale in units.items():
        if lowered.endswith(unit):
            number, scale = lowered[: -len(unit)], unit_scale
            break
    try:
        size = float(number) * scale
    except ValueError:
        size = math.nan
    if not (math.isfinite(size) and size > 0):          # NaN, inf, 0 and negatives plan nothing
        raise UserError(f"device memory {text!r}: expected a positive size such as 40GB, 80GiB or 4e10")
    return size


def prompt_tokens_of(job_cfg: Any, prompt_tokens: int | None = None) -> int:
    """The prompt length to plan for: given (e.g. `measured_prompt_tokens`), else rollout.max_prompt_length,
    else 128."""
    return prompt_tokens or job_cfg.rollout.max_prompt_length or DEFAULT_PROMPT_TOKENS


def measured_prompt_tokens(job_cfg: Any, task: Any, rollout: Rollout | None = None,
                           model_cfg: ModelConfig | None = None) -> int | None:
    """The longest of the first `PROMPT_SAMPLE` training prompts in tokens, rendered as the run's `rollout` renders
    them (`Rollout.prompt_lengths`; default: a single-turn rollout with model.path's tokenizer), as the rollout
    keeps it: at most rollout.max_prompt_length and the positions the model (`model_cfg`, else model.path's
    config) leaves a prompt, or the rollout's one-line refusal where truncation is off. None without tokenizer
    files or examples."""
    from jaxcore.hf.tokenization import PromptLimit, limit_prompts, tokenizer_if_present

    r = job_cfg.rollout
    if rollout is None:
        tokenizer = tokenizer_if_present(job_cfg.model.path or None, r.chat_template_kwargs)
        if tokenizer is None:
            return None
        rollout = Rollout(r, tokenizer)
    count = task.num_examples("train")
    examples = task.examples("train", PROMPT_SAMPLE if count is None else min(PROMPT_SAMPLE, count),
                             job_cfg.train.seed)
    if not examples:
        return None
    lengths = rollout.prompt_lengths(examples)
    longest = int(max(lengths))
    model_cfg = model_cfg or model_config_of(job_cfg)
    if model_cfg is None:
        return min(longest, r.max_prompt_length) if r.max_prompt_length else longest
    limit = PromptLimit(model_cfg.max_position_embeddings, r.max_prompt_length, r.truncate_prompts)
    lengths_B = np.asarray(lengths)
    mask_BT = (np.arange(longest)[None, :] >= longest - lengths_B[:, None]).astype(np.int32)
    limit_prompts(np.zeros_like(mask_BT), mask_BT, limit, r.completion_tokens, warn=False)  # refuses as the rollout
    return min(longest, limit.prompt_tokens(r.completion_tokens))


def model_config_of(job_cfg: Any) -> ModelConfig | None:
    """model.path's model config (config.json or a jaxcore checkpoint's); None where it cannot be read (the loader
    names the problem)."""
    hf = hf_config_at(job_cfg.model.path) if job_cfg.model.path else None
    try:
        return None if hf is None else config_from_hf(hf)
    except ConfigError:
        return None


def hf_config_at(path: str | Path) -> dict[str, Any] | None:
    """The HF config of a model directory (config.json) or a jaxcore checkpoint (jaxcore.json); None if neither.
    A file that is not valid JSON, or whose keys have the wrong types, is a CheckpointError naming it."""
    path = Path(path)
    if (path / "config.json").is_file():
        return read_json_config(path / "config.json")
    if (path / "jaxcore.json").is_file():
        return read_meta(path).get("hf_config")
    return None


def accelerator_memory() -> float | None:
    """The first local accelerator's memory limit (None on CPU backends)."""
    if jax.default_backend() == "cpu":
        return None
    return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")


def host_memory() -> float | None:
    """The host's physical memory in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def device_memory() -> float | None:
    """One device's memory: the accelerator's limit; on CPU backends the host's physical memory shared by its
    CPU devices (XLA:CPU has no limit of its own: a run that cannot fit dies on the allocation)."""
    memory = accelerator_memory()
    if memory is not None or jax.default_backend() != "cpu":
        return memory
    host = host_memory()
    return None if host is None else host / jax.local_device_count()


def check_fits(job_cfg: Any, algorithm: type[Algorithm], model_cfg: ModelConfig | None = None,
               prompt_tokens: int | None = None) -> str | None:
    """The refusal line when the configured run cannot fit its devices, else None. Needs only the model's
    config (`model_cfg`, else model.path's config.json) and the job config, so it runs before any weight is
    read. Device memory: the algorithm's configured one (ES: `mesh.device_memory`), else the accelerator's
    own limit, else (CPU backends) the host's memory over its CPU devices (`device_memory`)."""
    configured = algorithm.device_memory(job_cfg)
    memory = parse_bytes(configured) if configured else device_memory()
    divisor = algorithm.mesh_divisor(job_cfg)[1]
    if memory is None or divisor < 1 or jax.device_count() % divisor:
        return None               # the mesh builder names a bad divisor
    model_cfg = model_cfg or model_config_of(job_cfg)
    if model_cfg is None:
        return None               # the loader names what is missing
    try:
        plan = algorithm.memory_plan(job_cfg, model_cfg, devices=jax.device_count(), device_memory=memory,
                                     prompt_tokens=prompt_tokens)
    except UserError:
        return None               # a bad setting: the trainer's own check names it
    return refusal(plan)
