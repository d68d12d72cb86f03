"""jaxcore.parallel."""
