"""jaxcore: fast JAX/Flax NNX core for reward fine-tuning of LLMs (EGGROLL ES, GRPO).

    import jaxcore
    model = jaxcore.load_hf("path/to/hf_dir", dtype="float32")
    logits = model(input_ids, attention_mask=mask)
    jaxcore.save_hf(model, "out_dir", tokenizer_dir="path/to/hf_dir")

Heavy modules load lazily, so `import jaxcore.rewards` (e.g. in reward worker processes) stays light, and
importing runs nothing: the CLI and the trainers call `keep_freed_host_memory()` before their first JAX work (a
script that computes with JAX before it builds a trainer may call it first; `jaxcore.runtime.host_allocator`).
"""

import importlib
from typing import Any

__version__ = "0.1.0"
_LAZY = {
    "load_hf": "jaxcore.hf.convert", "save_hf": "jaxcore.hf.convert", "CheckpointError": "jaxcore.hf.convert",
    "Transformer": "jaxcore.model.transformer", "KVCache": "jaxcore.model.transformer",
    "load_model": "jaxcore.hf.model_checkpoint",
    "save_model": "jaxcore.hf.model_checkpoint",
    "ESTrainer": "jaxcore.api", "GRPOTrainer": "jaxcore.api",
    "ESConfig": "jaxcore.es.config", "GRPOConfig": "jaxcore.grpo.config",
    "keep_freed_host_memory": "jaxcore.runtime.host_allocator",
}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxcore' has no attribute {name!r}")
