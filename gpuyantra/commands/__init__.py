"""Subcommands of the `gpuyantra` CLI, one module each, and the argument types they share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a bad value exits 2 with one line, as argparse does)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
