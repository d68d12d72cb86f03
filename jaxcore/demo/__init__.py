"""jaxcore.demo."""
