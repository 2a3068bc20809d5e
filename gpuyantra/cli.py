"""`gpuyantra`: the one entry point. Each subcommand lives in `gpuyantra/commands/<name>.py`
and exposes `register(subparsers)`, which adds its parser and sets `handler` to a function
taking the parsed arguments and returning the exit code."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["verify", "serve", "optimize", "worker", "up", "demo", "skills", "kernelbench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuyantra",
        description="Profile a served model, write Triton kernels, verify them, hot-swap them in.",
    )
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
    args = parser.parse_args(argv)  # exits 2 with a message on a bad flag
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
