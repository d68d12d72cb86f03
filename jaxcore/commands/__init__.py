"""Subcommands of the `jaxcore` CLI: each module has `add_arguments(parser)` and `run(args)`.

May import: everything below the CLI (`jaxcore.api`, the demo, the benchmarks and the library underneath).
"""
