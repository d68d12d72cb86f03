"""EGGROLL evolution strategies: its settings and job config (`config`), the population as stand-in weights
over the unchanged model (`population`), noise and the update (`eggroll`), the ES algorithm on the runtime
(`algorithm`) and its memory plan (`memory`).

May import: `jaxcore.runtime` and the layers below it; never `jaxcore.grpo`.
"""
