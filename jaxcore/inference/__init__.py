"""jaxcore.inference."""
