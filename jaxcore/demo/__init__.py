"""`jaxcore demo`, an application of the library: a tiny model warm-started with a short supervised run
(`sft`), trained with EGGROLL and scored before and after with transformers (`run`).

May import: `jaxcore.api` and everything below it, and `torchref` (the reference evaluation).
"""

