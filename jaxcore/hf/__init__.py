"""Models in and out: HF directories <-> `Transformer` (`convert`, with the strict tensor-name `mapping`),
GGUF import (`gguf`), jaxcore's own orbax model checkpoints (`model_checkpoint`), tokenizers and prompt
encoding (`tokenization`), peft adapter directories (`peft`) and tiny local checkpoints (`tiny`).

May import: `jaxcore.model`, `jaxcore.rewards`, `jaxcore.config`, `jaxcore.errors`.
"""
