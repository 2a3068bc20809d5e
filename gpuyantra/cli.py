"""`gpuyantra`: the one entry point. Each subcommand lives in `gpuyantra/commands/<name>.py`
and exposes `register(subparsers)`, which adds its parser and sets `handler` to a function
taking the parsed arguments and returning the exit code."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from gpuyantra import __version__

COMMANDS = [
    "verify",
    "serve",
    "optimize",
    "worker",
    "up",
    "demo",
    "skills",
    "kernelbench",
    "report",
    "kernels",
    "status",
    "dashboard",
]


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit 2; subcommand parsers inherit this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpuyantra",
        description="Profile a served model, write Triton kernels, verify them, hot-swap them in.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (also accepted after the command)"
    )
    parser.add_argument("--version", action="version", version=f"gpuyantra {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gpuyantra.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"gpuyantra.commands.{name}":
                raise
            continue  # a command not built yet
        module.register(subparsers)
    for sub in subparsers.choices.values():
        _add_state_dir(sub)
    return parser


def _add_state_dir(parser: argparse.ArgumentParser) -> None:
    """The same `--state-dir` on every command (and skills subcommand) that touches the state folder."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if nested:
        for child in nested[0].choices.values():
            _add_state_dir(child)
        return
    if not any("--state-dir" in a.option_strings for a in parser._actions):
        parser.add_argument(
            "--state-dir",
            default=None,
            help="state folder (default: $GPUYANTRA_STATE_DIR, else ~/.local/share/gpuyantra)",
        )


# The exit status of a command whose reader went away (`gpuyantra ... | head -1`): what a shell
# reports for a process ended by SIGPIPE, 128 + 13.
BROKEN_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> int:
    try:
        code = run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_after_broken_pipe()
    if argv is None:  # the process's entry point (console script, `python -m`), not a caller in-process
        _exit_past_temporal_threads(code)
    return code


def _quiet_after_broken_pipe() -> int:
    """The reader of stdout closed it: nothing more can be shown, and no traceback either. Stdout
    points at /dev/null from here on, so the interpreter's own flush at exit finds nothing to fail on."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (a test's capture)
        pass
    return BROKEN_PIPE_EXIT


def _exit_past_temporal_threads(code: int) -> None:
    """A process that used a Temporal client can abort while Python finalizes (SIGABRT, exit 134,
    "PyGILState_Release"): the SDK's Rust threads outlive the interpreter (temporalio/sdk-python#300).
    The command is done by now, so flush and leave without finalizing."""
    if "temporalio.bridge.temporal_sdk_bridge" in sys.modules:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(argv: list[str]) -> int:
    parser = build_parser()
    if "--debug" in argv:  # anywhere on the line: moved before the command, where argparse takes it
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    args = parser.parse_args(argv)  # exits 2 with a message on a bad flag
    if getattr(args, "state_dir", None):  # one resolution for this process and all it starts
        os.environ["GPUYANTRA_STATE_DIR"] = str(Path(args.state_dir).expanduser().resolve())
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # the reader of stdout went away: main() leaves quietly
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless --debug
        if getattr(args, "debug", False):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"gpuyantra {args.command}: {type(exc).__name__}: {first} (run again with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
