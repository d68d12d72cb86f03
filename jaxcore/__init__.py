"""jaxcore: fast JAX/Flax NNX core for reward fine-tuning of LLMs (EGGROLL ES, GRPO).

    import jaxcore
    model = jaxcore.load_hf("path/to/hf_dir", dtype="float32")
    logits = model(input_ids, attention_mask=mask)
    jaxcore.save_hf(model, "out_dir", tokenizer_dir="path/to/hf_dir")

Heavy modules load lazily, so `import jaxcore.rewards` (e.g. in reward worker processes) stays light.
"""

import importlib
from typing import Any

from jaxcore import _moved
from jaxcore.runtime import host_allocator

__version__ = "0.1.0"
_LAZY = {
    "load_hf": "jaxcore.hf.convert", "save_hf": "jaxcore.hf.convert", "CheckpointError": "jaxcore.hf.convert",
    "Transformer": "jaxcore.model.transformer", "KVCache": "jaxcore.model.transformer",
    "load_model": "jaxcore.hf.model_checkpoint",
    "save_model": "jaxcore.hf.model_checkpoint",
    "ESTrainer": "jaxcore.api", "GRPOTrainer": "jaxcore.api",
    "ESConfig": "jaxcore.es.config", "GRPOConfig": "jaxcore.grpo.config",
}
__all__ = [*_LAZY, "__version__"]


host_allocator.keep_freed_host_memory()    # before JAX starts its CPU threads (see that module)
_moved.install()          # the flat module paths of earlier releases still import (deprecated)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _moved.MOVED and name not in _moved.PACKAGES_NOW:     # `from jaxcore import eggroll` (old path)
        return importlib.import_module(f"jaxcore.{name}")
    raise AttributeError(f"module 'jaxcore' has no attribute {name!r}")
