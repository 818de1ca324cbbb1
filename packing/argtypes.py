"""Command-line value types every ``gpuslice`` command shares (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a count of nodes, cards, jobs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value
