"""jaxcore.model."""
