"""Old flat module paths (before the package layout) keep importing, with a DeprecationWarning.

`from jaxcore.generate import generate`, `from jaxcore import eggroll` or `jaxcore.sharding.master_shardings`
resolve every name through the module(s) that now hold it. `jaxcore.model`, `jaxcore.grpo` and
`jaxcore.demo`, which are packages now, resolve their old module's names the same way.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module -> the modules that hold its names now, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "model_config": ("jaxcore.model.config",),
    "model": ("jaxcore.model.transformer", "jaxcore.model.state"),
    "lora": ("jaxcore.model.lora", "jaxcore.hf.peft"),
    "convert": ("jaxcore.hf.convert", "jaxcore.model.state"),
    "hf_mapping": ("jaxcore.hf.mapping",),
    "gguf_import": ("jaxcore.hf.gguf",),
    "model_checkpoint": ("jaxcore.hf.model_checkpoint",),
    "tokenization": ("jaxcore.hf.tokenization",),
    "tiny": ("jaxcore.hf.tiny",),
    "generate": ("jaxcore.inference.generate",),
    "sampling": ("jaxcore.inference.sampling",),
    "logprobs": ("jaxcore.inference.logprobs",),
    "sharding": ("jaxcore.parallel.sharding", "jaxcore.parallel.meshes", "jaxcore.parallel.rows"),
    "population": ("jaxcore.es.population", "jaxcore.model.state"),
    "eggroll": ("jaxcore.es.eggroll", "jaxcore.es.config", "jaxcore.model.state"),
    "es_trainer": ("jaxcore.es.algorithm", "jaxcore.parallel.rows"),
    "grpo": ("jaxcore.grpo.advantages", "jaxcore.grpo.loss", "jaxcore.grpo.config"),
    "grpo_loss": ("jaxcore.grpo.loss", "jaxcore.grpo.config"),
    "grpo_step": ("jaxcore.grpo.step", "jaxcore.grpo.config"),
    "grpo_learner": ("jaxcore.grpo.learner",),
    "grpo_trainer": ("jaxcore.grpo.algorithm",),
    "memory_plan": ("jaxcore.runtime.memory", "jaxcore.es.memory", "jaxcore.grpo.memory"),
    "plan_check": ("jaxcore.runtime.plan_check",),
    "train": ("jaxcore.runtime.runner", "jaxcore.runtime.algorithm"),
    "checkpoint": ("jaxcore.runtime.checkpoint",),
    "run_guard": ("jaxcore.runtime.run_guard",),
    "metrics": ("jaxcore.runtime.metrics",),
    "optim": ("jaxcore.runtime.optim",),
    "job_config": ("jaxcore.es.config", "jaxcore.grpo.config"),
    "yaml_config": ("jaxcore.config.yaml_config",),
    "trainers": ("jaxcore.api",),
    "demo": ("jaxcore.demo.run",),
    "sft": ("jaxcore.demo.sft",),
}
PACKAGES_NOW = ("model", "grpo", "demo")        # old modules whose name is a package today


def old_attribute(old: str, name: str) -> Any:
    """`name` of the old module `jaxcore.<old>`, from wherever it lives now (AttributeError if nowhere)."""
    for target in MOVED[old]:
        module = importlib.import_module(target)
        if hasattr(module, name):
            warnings.warn(f"jaxcore.{old} is now {target} (import {name} from there)", DeprecationWarning,
                          stacklevel=3)
            return getattr(module, name)
    raise AttributeError(f"module 'jaxcore.{old}' has no attribute {name!r}")


class _OldModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return old_attribute(self.__name__.removeprefix("jaxcore."), name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `jaxcore.<old>` for every old flat module that is not a package today."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix("jaxcore.")
        if fullname.startswith("jaxcore.") and old in MOVED and old not in PACKAGES_NOW:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _OldModule(spec.name, f"moved: see {', '.join(MOVED[spec.name.removeprefix('jaxcore.')])}")

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
