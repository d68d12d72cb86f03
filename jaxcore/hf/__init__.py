"""jaxcore.hf."""
