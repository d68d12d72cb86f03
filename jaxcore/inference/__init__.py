"""Inference on any `Transformer`, a population or LoRA model included: jitted prefill and KV-cache decode
(`generate`), the sampling filters in transformers' order (`sampling`) and token log-probs (`logprobs`).

May import: `jaxcore.hf`, `jaxcore.model` and the layers below them.
"""
