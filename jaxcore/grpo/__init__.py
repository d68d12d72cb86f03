"""jaxcore.grpo."""
