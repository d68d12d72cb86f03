"""Subcommands of the `torchref` CLI: each module has `add_arguments(parser)` and `run(args) -> int`."""
