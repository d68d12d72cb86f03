"""The transformer, written once for every family (Llama/SmolLM2, Qwen2/2.5, Qwen3, GPT-2): its architecture
config (`config`), the NNX module with its KV cache (`transformer`), parameters by dotted path (`state`) and
LoRA as a transformation over the unchanged model (`lora`).

May import: the layers below it in the import-linter contract (`jaxcore.config`, `jaxcore.rewards`,
`jaxcore.errors`); every other package builds on this one.
"""

