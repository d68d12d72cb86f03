"""The one training loop under every trainer (`runner.Runner`) and what it asks of an algorithm
(`algorithm.Algorithm`): the shared rollout (`rollout`), train checkpoints (`checkpoint`), the out_dir lock
and resume guard (`run_guard`), metrics (`metrics`), the one optimiser factory and schedule (`optim`), the
memory plan and its start-up check (`memory`, `plan_check`) and the loop's config sections (`config`).

May import: `jaxcore.parallel` and the layers below it; never `jaxcore.es` or `jaxcore.grpo`.
"""
