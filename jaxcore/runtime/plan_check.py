"""The start-up check that refuses a run which cannot fit its devices before any weight is read (the plan
itself is the algorithm's: `Algorithm.memory_plan`), and the helpers `jaxcore plan` shares with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from jaxcore.errors import UserError
from jaxcore.hf.convert import read_json_config
from jaxcore.hf.model_checkpoint import read_meta
from jaxcore.model.config import ConfigError, ModelConfig, config_from_hf
from jaxcore.runtime.algorithm import Algorithm
from jaxcore.runtime.memory import DEFAULT_PROMPT_TOKENS, refusal


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
        return float(number) * scale
    except ValueError:
        raise UserError(f"device memory {text!r}: expected a size such as 40GB, 80GiB or 4e10") from None


def prompt_tokens_of(job_cfg: Any, prompt_tokens: int | None = None) -> int:
    """The prompt length to plan for: given, else rollout.max_prompt_length, else 128."""
    return prompt_tokens or job_cfg.rollout.max_prompt_length or DEFAULT_PROMPT_TOKENS


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


def check_fits(job_cfg: Any, algorithm: type[Algorithm], model_cfg: ModelConfig | None = None,
               prompt_tokens: int | None = None) -> str | None:
    """The refusal line when the configured run cannot fit its devices, else None. Needs only the model's
    config (`model_cfg`, else model.path's config.json) and the job config, so it runs before any weight is
    read. Device memory: the algorithm's configured one (ES: `mesh.device_memory`), else the accelerator's
    own limit; CPU backends are not checked otherwise."""
    configured = algorithm.device_memory(job_cfg)
    memory = parse_bytes(configured) if configured else accelerator_memory()
    divisor = algorithm.mesh_divisor(job_cfg)[1]
    if memory is None or divisor < 1 or jax.device_count() % divisor:
        return None               # the mesh builder names a bad divisor
    if model_cfg is None:
        hf = hf_config_at(job_cfg.model.path) if job_cfg.model.path else None
        if hf is None:
            return None           # the loader names what is missing
        try:
            model_cfg = config_from_hf(hf)
        except ConfigError:
            return None
    try:
        plan = algorithm.memory_plan(job_cfg, model_cfg, devices=jax.device_count(), device_memory=memory,
                                     prompt_tokens=prompt_tokens)
    except UserError:
        return None               # a bad setting: the trainer's own check names it
    return refusal(plan)
