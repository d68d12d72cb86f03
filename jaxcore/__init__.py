"""jaxcore: fast JAX/Flax NNX core for reward fine-tuning of LLMs (EGGROLL ES, GRPO)."""

from jaxcore.convert import CheckpointError, load_hf, save_hf
from jaxcore.model import KVCache, Transformer

__version__ = "0.1.0"
__all__ = ["CheckpointError", "KVCache", "Transformer", "load_hf", "save_hf", "__version__"]
