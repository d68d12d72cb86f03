"""The `jaxcore` command. Each subcommand lives in `jaxcore.commands.<name>` and is imported lazily.

    jaxcore convert --from-hf DIR --out CKPT      jaxcore convert --to-hf CKPT --out DIR
    jaxcore generate --model DIR --prompt "..."   jaxcore es --config configs/X.yaml key=value
    jaxcore grpo --config configs/X.yaml          jaxcore bench --suite all --json out.json
    jaxcore demo
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from jaxcore.errors import Interrupted, UserError, is_out_of_memory, out_of_memory  # noqa: F401  (UserError: re-exported)

SUBCOMMANDS = {
    "convert": "Convert between HF directories and jaxcore (orbax) checkpoints",
    "generate": "Sample completions from a model directory or checkpoint",
    "es": "EGGROLL evolution-strategies training",
    "grpo": "GRPO training",
    "plan": "Per-device memory of an ES run (from config.json; no weights)",
    "bench": "Benchmarks that print ratios against a reference measured in the same run",
    "demo": "The main job: ES on a tiny local model and task, evaluated with transformers",
}


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (not a bug): shown as one line without a traceback."""
    from jaxcore.errors import USER_ERRORS

    return USER_ERRORS


class CurrentStderrHandler(logging.StreamHandler):
    """Logs to whatever `sys.stderr` is at the time of the record (not the stream of the first call)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def quiet_library_logs() -> None:
    """JAX, absl and orbax log every checkpoint step at INFO; keep them to warnings."""
    for name in ("absl", "jax", "orbax", "jax._src.xla_bridge", "httpx", "datasets"):
        logging.getLogger(name).setLevel(logging.WARNING)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (exit code 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def make_parser(prog: str, description: str | None, subcommands: dict[str, tuple[str, str]]
                ) -> argparse.ArgumentParser:
    """A parser whose subcommands are modules with `add_arguments(parser)` and `run(args)`.

    `subcommands` maps a command name to (module path, one-line help).
    """
    parser = OneLineParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an unexpected error (a bug) instead of one line")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_path, help_text) in subcommands.items():
        module = importlib.import_module(module_path)
        sub = subparsers.add_parser(name, help=help_text, description=module.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def dispatch(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None,
             error_types: Callable[[], tuple[type[BaseException], ...]]) -> int:
    """Build the parser, parse, set up logging, run the subcommand. Bad input is one line on stderr and exit
    code 2; Ctrl-C anywhere (start-up included; a training run handles its first SIGINT itself) is the line
    "interrupted" and exit code 130 (SIGTERM: "stopped by SIGTERM", 143), without a traceback
    (`runtime.signals`). The backstop: any other exception (a bug, or bad input no check names yet) is one line
    with its type and message and exit code 1; `--debug` re-raises it (the traceback). Called as the program
    (`argv` None), a further SIGINT/SIGTERM once the exit code is known ends the process at once with the
    signal's code (`signals.exits_at_once`)."""
    from jaxcore.runtime.signals import exits_at_once

    try:
        return _dispatch(build_parser, argv, error_types)
    finally:                    # also argparse's SystemExit (--help, a usage error)
        if argv is None:        # the program itself (not a call in-process): its exit code is final
            exits_at_once()


def _dispatch(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None,
              error_types: Callable[[], tuple[type[BaseException], ...]]) -> int:
    """`dispatch` up to the exit code."""
    from jaxcore.runtime.signals import stops_the_command

    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    prog = "error"
    try:
        with stops_the_command():
            parser = build_parser()
            prog = parser.prog
            return _parse_and_run(parser, argv, error_types)
    except KeyboardInterrupt as err:            # `Interrupted`: what the stop left, and the signal's exit code
        print(str(err) if isinstance(err, Interrupted) else "interrupted", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    except Exception as err:
        if debug:
            raise
        if is_out_of_memory(err):                   # where no command named its settings (a training run does)
            print(f"{prog}: error: {out_of_memory(err, 'lower the sizes the command was given (batch, lengths)')}",
                  file=sys.stderr)
            return 2
        print(f"{prog}: error: unexpected {type(err).__name__}: {_first_line(err)} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0].strip() if lines else "(no message)"


def _parse_and_run(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                   error_types: Callable[[], tuple[type[BaseException], ...]]) -> int:
    """`dispatch` once the parser is built: bad input (`error_types()`) is one line and exit code 2."""
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[CurrentStderrHandler()],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    quiet_library_logs()
    try:
        return int(args.run(args) or 0)
    except error_types() as err:
        message = _first_line(err) if str(err).strip() else type(err).__name__
        print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    return make_parser("jaxcore", __doc__, {name: (f"jaxcore.commands.{name}", help_text)
                                            for name, help_text in SUBCOMMANDS.items()})


def main(argv: Sequence[str] | None = None) -> int:
    from jaxcore.runtime import host_allocator

    host_allocator.keep_freed_host_memory()     # before the command's first JAX work (see that module)
    return dispatch(build_parser, argv, user_error_types)


if __name__ == "__main__":
    sys.exit(main())
