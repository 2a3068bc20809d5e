"""`gpuyantra`: the one entry point. Each subcommand lives in `gpuyantra/commands/<name>.py`
and exposes `register(subparsers)`, which adds its parser and sets `handler` to a function
taking the parsed arguments and returning the exit code."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

COMMANDS = ["verify", "serve", "optimize", "worker", "up", "demo", "skills", "kernelbench", "report"]


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit 2; subcommand parsers inherit this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpuyantra",
        description="Profile a served model, write Triton kernels, verify them, hot-swap them in.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also accepted after the command)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gpuyantra.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"gpuyantra.commands.{name}":
                raise
            continue  # a command not built yet
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if "--debug" in argv:  # anywhere on the line: moved before the command, where argparse takes it
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    args = parser.parse_args(argv)  # exits 2 with a message on a bad flag
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless --debug
        if getattr(args, "debug", False):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"gpuyantra {args.command}: {type(exc).__name__}: {first} (run again with --debug for the "
              f"traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
