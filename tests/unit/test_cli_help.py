"""Every ``gpuslice`` command's --help, as a newcomer reads it: each option explained, no raw markup."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

import pytest

from packing.cli import SUBCOMMANDS, _load


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``gpuslice <command>`` builds, caught as it is about to parse (nothing runs)."""

    def caught(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(_Parsed) as parsed:
        _load(SUBCOMMANDS[command][0])([])
    return parsed.value.parser


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_option_says_what_it_does(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ap = parser_of(command, monkeypatch)
    silent = [a.option_strings[0] for a in ap._actions
              if a.option_strings and not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert silent == [], f"gpuslice {command}: options without help"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_has_no_raw_markup_or_doubled_percent(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = parser_of(command, monkeypatch).format_help()
    assert "``" not in text and ":func:" not in text and ":class:" not in text, text
    assert "%%" not in text, text  # argparse halves %% in help strings only: a description shows it raw
    assert not re.search(r"%\(\w+\)", text), text


def test_numeric_timing_flags_name_their_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare number of what? The agent's and the extender's timing flags say seconds (or GPU-seconds)."""
    for command, flags in (("agent", ("--memory-period", "--slot", "--period", "--max-freeze", "--burst",
                                      "--grace", "--freeze-ceiling", "--nvml-deadline", "--stall")),
                           ("serve", ("--reservation-ttl", "--body-timeout", "--slow-request", "--waiting-ttl"))):
        actions = {a.option_strings[0]: a for a in parser_of(command, monkeypatch)._actions if a.option_strings}
        for flag in flags:
            a = actions[flag]
            said = f"{a.metavar or ''} {a.help or ''}"
            assert re.search(r"SECONDS|seconds|\d s\b", said), f"gpuslice {command} {flag}: {said!r}"
