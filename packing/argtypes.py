"""Command-line value types every ``gpuslice`` command shares (argparse ``type=`` callables).

Each checks its value where it is parsed, so argparse names the flag in the one-line error
(``argument --period: expected a number of seconds > 0, got 'nan'``).
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


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


def dns_label(text: str) -> str:
    """A Kubernetes name that must be a DNS label (a namespace, a Service): lower case, digits, '-', <= 63."""
    if len(text) > 63 or not _LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a DNS label (lower-case letters, digits and '-', at most 63, "
                                         f"e.g. gpuslice-system), got {text!r}")
    return text


def dns_subdomain(text: str) -> str:
    """A Kubernetes object name that must be a DNS subdomain: DNS labels joined by dots, <= 253."""
    if len(text) > 253 or not all(_LABEL.fullmatch(part) for part in text.split(".")):
        raise argparse.ArgumentTypeError(f"expected a DNS name (lower-case labels joined by dots, e.g. "
                                         f"gpuslice-extender.gpuslice-system.svc), got {text!r}")
    return text


def host_name(text: str) -> str:
    """A name a certificate may carry: an IP address, or a DNS name (its first label may be '*')."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    try:
        return dns_subdomain(text.removeprefix("*.") if text.startswith("*.") else text) and text
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a DNS name or an IP address, got {text!r}") from None
