"""Subcommands of the `gpuyantra` CLI, one module each, and the argument types they share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a bad value exits 2 with one line, as argparse does)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def stage_printer(command: str, quiet: bool) -> Callable[[str], None]:
    """`say(line)` for a long command's stages: one line each on stderr (`command: line`) while stderr
    is a terminal; nothing with --json (`quiet`) or when stderr goes to a file or a pipe."""
    if quiet or not sys.stderr.isatty():
        return lambda line: None
    return lambda line: print(f"{command}: {line}", file=sys.stderr, flush=True)
