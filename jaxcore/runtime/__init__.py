"""jaxcore.runtime."""
