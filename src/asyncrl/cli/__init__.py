"""The ``asyncrl`` command line: train, simulate, validate, plot, export, fleet."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from asyncrl.errors import AsyncRLError


class CommandParser(argparse.ArgumentParser):
    """A command's parser: its positionals (the ``key.path=value`` overrides) may
    come before, between or after its options, e.g. ``asyncrl validate --config X
    seed=1 --json a.b=c``.

    Plain argparse takes a command's positionals from one consecutive run of
    arguments only. Its intermixed parsing (``parse_intermixed_args``) takes them
    from anywhere but refuses a parser with subcommands, so it is each command's
    own parser that parses intermixed, when the top-level parser hands it the
    command's arguments.
    """

    _intermixed = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._intermixed:  # the two passes of the intermixed parse itself
            return super().parse_known_args(args, namespace)
        self._intermixed = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False


def build_parser() -> argparse.ArgumentParser:
    from asyncrl.cli import export, fleet, plot, simulate, train, validate

    parser = argparse.ArgumentParser(
        prog="asyncrl",
        description="Asynchronous RL for language-model policies, with pluggable staleness samplers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser)
    for module in (train, simulate, validate, plot, export, fleet):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from asyncrl.cli.streams import guard_output

    with guard_output():  # a closed output pipe (| head, a dead tee) never stops a run
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the commands load: nothing ran yet
        print("asyncrl: interrupted", file=sys.stderr)
        return 130
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose:  # our own loggers only: third-party debug output is noise here
        logging.getLogger("asyncrl").setLevel(logging.DEBUG)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # vLLM's start-up log too
    from asyncrl.run.signals import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():  # SIGTERM is Ctrl-C's twin until the process exits
            return int(args.func(args) or 0)
    except AsyncRLError as exc:
        # Our own errors carry the fix in their message: no traceback needed.
        print(f"asyncrl {args.command}: error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # other errors of the run, how to resume
            print(note, file=sys.stderr)
        if args.verbose and exc.__cause__ is not None:  # e.g. the user's code that raised
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        from asyncrl.run.signals import Terminated

        terminated = isinstance(exc, Terminated)
        print(f"asyncrl {args.command}: {'terminated' if terminated else 'interrupted'}",
              file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # e.g. how to start it again
            print(note, file=sys.stderr)
        return 143 if terminated else 130


__all__ = ["CommandParser", "build_parser", "main"]
