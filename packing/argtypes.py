"""Command-line value types every ``gpuslice`` command shares (argparse ``type=`` callables).

Each checks its value where it is parsed, so argparse names the flag in the one-line error
(``argument --period: expected a number of seconds > 0, got 'nan'``).
"""

from __future__ import annotations

import argparse
import math
import os


def _whole(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a count of nodes, cards, jobs)."""
    value = _whole(text, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number of at least 0."""
    value = _whole(text, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port to listen on, 1..65535."""
    value = _whole(text, "a port number 1..65535")
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number 1..65535, got {text!r}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0 (seconds, a share, a ratio)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_number(text: str) -> float:
    """A finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def readable_file(text: str) -> str:
    """A path to a file that exists and can be read (its content is checked by whoever reads it)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file, got ''")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"no file {text}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text} (permission denied)")
    return text
