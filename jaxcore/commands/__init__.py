"""Subcommands of the `jaxcore` CLI: each module has `add_arguments(parser)` and `run(args)`."""
