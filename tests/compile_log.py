"""A helper the compile-count tests of several packages share: JAX's own compile log, routed to a handler."""

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import jax

COMPILED = re.compile(r"Finished XLA compilation of (?:jit\()?([\w<>.\-]+)")


@contextmanager
def jax_compile_log(handler: logging.Handler) -> Iterator[None]:
    """Send JAX's compile log (`jax_log_compiles`) to `handler` while the block runs; restore the logger after."""
    jax_logger = logging.getLogger("jax")
    jax_logger.addHandler(handler)
    previous_level = jax_logger.level
    jax_logger.setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)
    try:
        yield
    finally:
        jax.config.update("jax_log_compiles", False)
        jax_logger.removeHandler(handler)
        jax_logger.setLevel(previous_level)


class CompiledPrograms(logging.Handler):
    """Records the name of every program XLA compiles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = COMPILED.search(record.getMessage())
        if match:
            self.names.append(match.group(1))
