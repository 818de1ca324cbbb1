"""The one rule every ``gpuslice`` command follows on bad input (README.md, 'When a command refuses').

* A usage error is one line, ``PROG: error: WHAT``, and a hint to ``--help`` (never the whole usage),
  exit status 2 (:meth:`CommandParser.error`).
* A value is checked where it is parsed (an argparse ``type=`` callable), so its message names the flag.
* An option that does not apply to what was asked (a protocol, a mode, another option given with it)
  is refused, saying why and what to use instead: :class:`Applies` and :class:`Conflict` rules, checked
  against the options *given on the command line* (a default or an environment twin is not given),
  by :meth:`CommandParser.check` right after parsing (``if ap.check(args, RULES): return 2``).
* An old flag name keeps working as a deprecated alias that warns (:meth:`CommandParser.alias`).
* A run that cannot reach what was asked (an offered load, a target) says so on its first line and
  exits non-zero, unless the command's ``--allow-...`` flag is given (each command decides its own).
* Whatever a command does not expect ends as one line and exit status 1 (:func:`guarded`); ``--debug``
  (every command takes it) or ``GPUSLICE_DEBUG=1`` prints the traceback too.

To apply it to a new option: build the parser with :class:`CommandParser`, give the option a
``type=`` that raises ``argparse.ArgumentTypeError`` with what is wrong, and add an :class:`Applies`
rule if it only means something in some runs. ``tests/property/test_cli_refusals.py`` walks every
command's options with bad values and checks the rule holds.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Applies:
    """``flags`` mean something only when ``when(args)`` holds; given otherwise, the first is refused with
    ``FLAG WHY; INSTEAD``, e.g. ``--offline applies to protocol A only (this run is protocol B); drop it,
    or add --protocol a``."""

    flags: tuple[str, ...]
    when: Callable[[argparse.Namespace], bool]
    why: str
    instead: str


@dataclass(frozen=True)
class Conflict:
    """``first`` and ``second`` say the same thing two ways (or exclude each other); both given, the
    run is refused with ``FIRST and SECOND cannot go together: INSTEAD``."""

    first: str
    second: str
    instead: str


class _DeprecatedAlias(argparse.Action):
    """An old name of an option: stores into the new one's ``dest`` and says, once, to use the new name."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that errs in one line, knows which options were given, and checks rules."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.given: dict[str, str] = {}  # dest -> the option string typed on the command line
        self.add_argument("--debug", action="store_true", help="on an unexpected error, print its traceback too")

    # ---- errors --------------------------------------------------------------------------------------

    def hint(self) -> str:
        return f"('{self.prog} --help' lists every option)"

    def usage_error(self, message: str) -> int:
        """Print the one-line error and the hint; the exit status of a usage error (2)."""
        print(f"{self.prog}: error: {one_line(message)}\n{self.hint()}", file=sys.stderr)
        return 2

    def error(self, message: str) -> NoReturn:
        raise SystemExit(self.usage_error(message))

    # ---- what was given ------------------------------------------------------------------------------

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        self.given = self._given(argv)
        return super().parse_known_args(argv, namespace)

    def _given(self, argv: Sequence[str]) -> dict[str, str]:
        """The options on the command line, by ``dest``, as typed (abbreviations resolved as argparse does)."""
        out: dict[str, str] = {}
        for token in argv:
            if token == "--":
                break
            if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
                continue
            name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            action = self._option_string_actions.get(name)
            if action is None and token.startswith("--") and self.allow_abbrev:
                found = {id(a): a for s, a in self._option_string_actions.items() if s.startswith(name)}
                action = next(iter(found.values())) if len(found) == 1 else None
            if action is not None:
                out.setdefault(action.dest, name)
        return out

    def flag_of(self, option: str) -> str:
        """How the user wrote ``option`` (an alias, an abbreviation), or ``option`` itself."""
        return self.given.get(self._option_string_actions[option].dest, option)

    def was_given(self, option: str) -> bool:
        """Whether ``option`` (any of its names) was on the command line (False for one this parser lacks)."""
        action = self._option_string_actions.get(option)
        return action is not None and action.dest in self.given

    def flagged(self, message: str, args: argparse.Namespace) -> str:
        """``message`` naming the option whose file it is about: ``x.toml: not valid TOML`` ->
        ``--catalog x.toml: not valid TOML``; ``cannot write the plots into x/ ...`` -> ``--plots: cannot ...``.
        Only path-like values (with a / or a .) are matched, the longest first."""
        found = []
        if any(typed in message for typed in self.given.values()):
            return message  # it names its flag already
        for dest, typed in self.given.items():
            value = getattr(args, dest, None)
            for part in str(value).split(",") if isinstance(value, (str, os.PathLike)) else ():
                if len(part) >= 3 and ("/" in part or "." in part) and part in message:
                    found.append((len(part), part, typed))
        if not found:
            return message
        _, part, typed = max(found)
        return f"{typed} {message}" if message.startswith(part) else f"{typed}: {message}"

    # ---- the rules -----------------------------------------------------------------------------------

    def check(self, args: argparse.Namespace, rules: Iterable[Applies | Conflict]) -> int:
        """0 when every option given applies; else the first refusal printed (one line and the hint) and 2.
        A rule's option this parser does not have is skipped: one rule list can serve several commands."""
        for rule in rules:
            if isinstance(rule, Conflict):
                if self.was_given(rule.first) and self.was_given(rule.second):
                    return self.usage_error(f"{self.flag_of(rule.first)} and {self.flag_of(rule.second)} cannot go "
                                            f"together: {rule.instead}")
                continue
            given = [f for f in rule.flags if self.was_given(f)]
            if given and not rule.when(args):
                return self.usage_error(f"{self.flag_of(given[0])} {rule.why}; {rule.instead}")
        return 0

    def alias(self, old: str, new: str) -> None:
        """Accept ``old`` for the option ``new`` (same value), warning that it is deprecated; hidden in --help."""
        action = self._option_string_actions[new]
        typed: dict[str, Any] = {"type": action.type} if action.type is not None else {}
        self.add_argument(old, action=_DeprecatedAlias, new=new, dest=action.dest, metavar=action.metavar,
                          choices=action.choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **typed)


def one_line(text: object) -> str:
    """A message on one line (YAML and HTTP errors come in several)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= 400 else flat[:397] + "..."


def fields_as_flags(message: str, flags: dict[str, str]) -> str:
    """A validator's message in the words of the command line: ``period_s`` -> ``--period``."""
    for field, flag in sorted(flags.items(), key=lambda item: -len(item[0])):
        message = re.sub(rf"(?<![-\w]){re.escape(field)}\b", flag, message)  # not inside a flag already named
    return message


def debugging(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("GPUSLICE_DEBUG", "") not in ("", "0")


def guarded(prog: str, run: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """``run(argv)``'s exit status; an error it did not expect is one line on stderr and status 1.

    ``SystemExit`` passes (argparse's usage errors, ``--help``); Ctrl-C is status 130 without a traceback.
    """
    try:
        return run(argv)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as cat and kubectl do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, the shell's status for it
    except Exception as e:
        if debugging(argv):
            traceback.print_exc()
        print(f"{prog}: unexpected error: {type(e).__name__}: {one_line(e)}"
              + ("" if debugging(argv) else " (--debug prints the traceback)"), file=sys.stderr)
        return 1
