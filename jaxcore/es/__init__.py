"""jaxcore.es."""
