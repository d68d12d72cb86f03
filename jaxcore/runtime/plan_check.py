"""Plans of `jaxcore es` / `jaxcore grpo` job configs (`jaxcore plan`), and the start-up check that
refuses a run which cannot fit its devices before any weight is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxcore.errors import UserError
from jaxcore.model.config import ModelConfig
from jaxcore.runtime.memory import DEFAULT_PROMPT_TOKENS, MemoryPlan, plan_es, plan_grpo, refusal


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


def plan_es_config(es_cfg: Any, model_cfg: ModelConfig, *, devices: int, device_memory: float | None = None,
                   prompt_tokens: int | None = None, population: int | None = None) -> MemoryPlan:
    """`plan_es` for a `jaxcore es` config (ESConfig)."""
    es, r, opt = es_cfg.es, es_cfg.rollout, es_cfg.optimizer
    return plan_es(model_cfg, population=population or es.population, rank=es.rank, prompts=r.prompts_per_epoch,
                   generations=r.generations_per_prompt, prompt_tokens=prompt_tokens_of(es_cfg, prompt_tokens),
                   max_new_tokens=r.max_new_tokens, devices=devices, model_axis=es_cfg.mesh.model,
                   compute_dtype=es_cfg.model.dtype, master_dtype=es.master_dtype, optimizer=opt.name,
                   momentum=bool(opt.momentum), device_memory=device_memory,
                   shard_min_size=es_cfg.mesh.shard_min_size)


def plan_grpo_config(grpo_cfg: Any, model_cfg: ModelConfig, *, devices: int, device_memory: float | None = None,
                     prompt_tokens: int | None = None, prompts: int | None = None) -> MemoryPlan:
    """`plan_grpo` for a `jaxcore grpo` config (GRPOConfig)."""
    g, r = grpo_cfg.grpo, grpo_cfg.rollout
    lora = g.lora
    micro = g.steps_per_generation or g.gradient_accumulation_steps
    old_logp = (g.num_iterations > 1 or micro // g.gradient_accumulation_steps > 1) and r.temperature != 1.0
    return plan_grpo(model_cfg, prompts=prompts or r.prompts_per_epoch, generations=r.generations_per_prompt,
                     prompt_tokens=prompt_tokens_of(grpo_cfg, prompt_tokens), max_new_tokens=r.max_new_tokens,
                     devices=devices, fsdp=g.fsdp, compute_dtype=grpo_cfg.model.dtype, beta=g.beta,
                     lora_rank=lora.rank if lora else None,
                     lora_targets=tuple(lora.target_modules) if lora else (),
                     lora_base_dtype=lora.base_dtype if lora else None, remat=grpo_cfg.model.remat,
                     micro_batches=micro, accumulation=g.gradient_accumulation_steps,
                     scoring=g.beta != 0.0 or old_logp, device_memory=device_memory)


def plan_config(job_cfg: Any, model_cfg: ModelConfig, **kw: Any) -> MemoryPlan:
    """The plan of an ES or GRPO job config (told apart by its schema: GRPO's has a `grpo` section)."""
    return plan_grpo_config(job_cfg, model_cfg, **kw) if hasattr(job_cfg, "grpo") else \
        plan_es_config(job_cfg, model_cfg, **kw)


def mesh_divisor(job_cfg: Any) -> tuple[str, int]:
    """The mesh setting that must divide the device count: ("mesh.model", M) or ("grpo.fsdp", F)."""
    return ("grpo.fsdp", job_cfg.grpo.fsdp) if hasattr(job_cfg, "grpo") else ("mesh.model", job_cfg.mesh.model)


def hf_config_at(path: str | Path) -> dict[str, Any] | None:
    """The HF config of a model directory (config.json) or a jaxcore checkpoint (jaxcore.json); None if neither."""
    path = Path(path)
    try:
        if (path / "config.json").is_file():
            return json.loads((path / "config.json").read_text())
        if (path / "jaxcore.json").is_file():
            return json.loads((path / "jaxcore.json").read_text()).get("hf_config")
    except (OSError, json.JSONDecodeError):
        return None           # the loader reports it properly
    return None


def accelerator_memory() -> float | None:
    """The first local accelerator's memory limit (None on CPU backends)."""
    import jax

    if jax.default_backend() == "cpu":
        return None
    return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")


def check_fits(job_cfg: Any, model_cfg: ModelConfig | None = None, prompt_tokens: int | None = None) -> str | None:
    """The refusal line when the configured ES or GRPO run cannot fit its devices, else None. Needs only
    the model's config (`model_cfg`, else model.path's config.json) and the job config, so it runs before
    any weight is read. Device memory: ES's `mesh.device_memory`, else the accelerator's own limit; CPU
    backends are not checked otherwise."""
    import jax

    from jaxcore.model.config import ConfigError, config_from_hf

    configured = getattr(getattr(job_cfg, "mesh", None), "device_memory", "")
    memory = parse_bytes(configured) if configured else accelerator_memory()
    divisor = mesh_divisor(job_cfg)[1]
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
        plan = plan_config(job_cfg, model_cfg, devices=jax.device_count(), device_memory=memory,
                           prompt_tokens=prompt_tokens)
    except UserError:
        return None               # a bad setting: the trainer's own check names it
    return refusal(plan)
