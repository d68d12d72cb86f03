"""GRPO with TRL 1.16's formulas: its settings and job config (`config`), rewards and advantages
(`advantages`), the loss (`loss`), the jitted train step (`step`), the learner that owns the state
(`learner`), the GRPO algorithm on the runtime (`algorithm`) and its memory plan (`memory`).

May import: `jaxcore.runtime` and the layers below it; never `jaxcore.es`.
"""

