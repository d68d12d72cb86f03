"""jaxcore.config."""
