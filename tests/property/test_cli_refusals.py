"""Every ``gpuslice`` command's parser, walked with bad values (issue #29; the rule: packing/usage.py).

For every option of every subcommand (``packing.cli.SUBCOMMANDS``, so a new command is walked too),
hypothesis draws a value that is wrong for it: the wrong type, a negative, nan, an unknown name, a
file that is missing or is a folder, an output under a file; and, from each command's rules, an
option of another protocol or mode. Each run goes through the real entry point, in-process, with
whatever would start work (a simulation, gunicorn, the agent's loop, an API call) replaced by a
sentinel: reaching it means the bad value was accepted, and the test fails. Every run must end with
exit status 2 or 1, at most 3 lines on stderr, no traceback, and the offending flag named.

A new option is walked once this file knows how to make its value wrong: its ``type=`` is in
``BAD_BY_TYPE`` (the shared ``packing.argtypes`` and ``simulations.options`` types are), or it has
``choices``, or it is in ``BAD_BY_OPTION`` or, with the reason no parser can check it, ``FREE``.
``test_every_option_is_walked`` fails until then.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from enforcement import cli as agent_cli
from enforcement.node import _limiter_mode
from enforcement.simnode import simulated_gpus
from extender import cli as extender_cli
from packing import argtypes
from packing.cli import SUBCOMMANDS, _load
from packing.cli import main as gpuslice
from packing.policies import POLICIES
from packing.queue import ADMISSION_POLICIES
from packing.usage import Applies, CommandParser, Conflict
from simulations import cli as simulations_cli
from simulations import command_cluster, options
from simulations.scheduler import TIES

# per property: with the sweep below they cover every option in seconds; GPUSLICE_CLI_EXAMPLES=3000 digs deeper
EXAMPLES = int(os.environ.get("GPUSLICE_CLI_EXAMPLES", "150"))


class Accepted(BaseException):
    """The command went on to do its work: the value it was given was not refused."""


def _accepted(*args: Any, **kwargs: Any) -> NoReturn:
    raise Accepted


# ---- what a wrong value is -----------------------------------------------------------------------

WORDS = st.text(string.ascii_letters + string.digits + "-_.:/ \n", min_size=1, max_size=12)
NOT_A_NUMBER = WORDS.filter(lambda t: not _is_number(t))
NEGATIVE = st.integers(max_value=-1).map(str) | st.floats(max_value=-1e-6, allow_nan=False).map(repr)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Bad:
    """Wrong values of an option: known ones (the first is the sweep's) and, maybe, generated ones."""

    examples: tuple[str, ...]
    more: st.SearchStrategy[str] | None = None

    @property
    def strategy(self) -> st.SearchStrategy[str]:
        fixed = st.sampled_from(self.examples)
        return fixed if self.more is None else fixed | self.more


def _bad(*examples: str, more: st.SearchStrategy[str] | None = None) -> Bad:
    return Bad(examples, more)


NUMBER_BAD = ("nan", "inf", "-inf", "x", "", "1,5")
BAD_BY_TYPE: dict[Any, Bad] = {
    argtypes.positive_int: _bad("0", "-3", "1.5", "many", "", more=NEGATIVE | NOT_A_NUMBER),
    argtypes.non_negative_int: _bad("-1", "2.5", "x", more=NEGATIVE | NOT_A_NUMBER),
    argtypes.port: _bad("0", "65536", "-1", "http", more=NEGATIVE | NOT_A_NUMBER),
    argtypes.positive_number: _bad("0", "-0.5", *NUMBER_BAD, more=NEGATIVE | NOT_A_NUMBER),
    argtypes.non_negative_number: _bad("-0.5", *NUMBER_BAD, more=NEGATIVE | NOT_A_NUMBER),
    argtypes.dns_label: _bad("Bad_NS", "-x", "a.b", "", "x" * 64),
    argtypes.dns_subdomain: _bad("Bad_Name", "a..b", "", "-x.y"),
    argtypes.host_name: _bad("not a host", "a..b", "", "_x"),
    options.parse_duration: _bad("-5m", "5x", "abc", "", "1w", more=NEGATIVE),
    options.parse_target: _bad("10", "-5m", "1w", "x", more=NEGATIVE),
    options.parse_cap: _bad("-1h", "x", "5y"),
    options.parse_seeds: _bad("5-1", "a", "", "1-b"),
    options.parse_rho: _bad("0", "-1", "nan", "inf", "x", more=NEGATIVE | NOT_A_NUMBER.filter(
        lambda t: t.strip().lower() not in ("none", "trace", "keep"))),
    options.parse_rhos: _bad("0", "-1", "nan", "inf", "x", "0.7,-1", "0.85,x", ",", more=NEGATIVE | NOT_A_NUMBER.filter(
        lambda t: t.strip().lower() not in ("none", "trace", "keep") and "," not in t)),  # several: each as --rho's
    options.parse_load: _bad("none", "0", "-1", "nan", "x", more=NEGATIVE),
    options.parse_inflation: _bad("0.5", "0", "-1", "nan", "inf", "x", more=NEGATIVE),
    options.parse_percentile: _bad("101", "-1", "nan", "x", more=NEGATIVE),
    options.processes: _bad("-1", "x", "1.5", more=NEGATIVE),
    simulated_gpus: _bad("0", "65", "-2", "2.5", "{missing}", "{folder}", "{binary}"),
    agent_cli._listen: _bad("nowhere", "h:99999", "127.0.0.1:", ":x"),
    _limiter_mode: _bad("bogus", "GPUSLICE", ""),
    extender_cli._url_prefix: _bad("v1", "/v1/", "/a b"),
    extender_cli._linger: _bad("61", "-1", "nan", "x", more=NEGATIVE | NOT_A_NUMBER),
    extender_cli._path_segment: _bad("", "a/b", "a b"),
    extender_cli._subject: _bad("CN", "XX=a", "/", "CN="),
    simulations_cli.plan_target: _bad("10", "-5m", "v100-100:p101=1h", "x:p99", "1w", "all:p0=1h"),
    command_cluster.parse_add_cards: _bad("x", "-1", "", ":m", "1.5"),
    command_cluster._positive: _bad("0", "-1", "nan", "inf", "x", more=NEGATIVE),
}
FILE_TYPES = (argtypes.readable_file, options.input_paths)
# content errors of files are the rows' tests (tests/unit/test_cli_refusals.py)
FILE_BAD = _bad("{missing}", "{folder}")
OUTPUT_BAD = _bad("{file}/x", "{file}/x/y")  # an output under a file: refused before any work

NAMES = WORDS.filter(lambda t: "," not in t and ":" not in t)
BAD_BY_OPTION: dict[tuple[str, str], tuple[Bad, list[str]]] = {
    # (command, option): (wrong values, the context that reaches the check)
    ("serve", "--host"): (_bad("no such host", "256.256.256.256", ""), ["--standalone", "--nodes", "1"]),
    ("serve", "--gpu-model"): (_bad("Tesla-T4", more=NAMES.filter(lambda t: t != "Tesla-V100-SXM2-32GB")),
                               ["--standalone", "--nodes", "1"]),
    **{(c, "--url"): (_bad("127.0.0.1:8888", "ftp://x", more=WORDS.filter(
        lambda t: not t.startswith(("http://", "https://")))), []) for c in ("status", "leave")},
    ("agent", "--node-name"): (_bad(""), []),
    ("demo", "--catalog"): (FILE_BAD, []),
    **{(c, "--policy"): (_bad("best_fit", "", more=NAMES.filter(lambda t: t.strip() not in POLICIES)), [])
       for c in ("simulate", "plan")},
    **{(c, "--ties"): (_bad("sideways", more=NAMES.filter(lambda t: t.strip() not in TIES)), [])
       for c in ("simulate", "plan")},
    **{(c, "--admission"): (_bad("aging-guard:t=5m", "aging-guard:X=1", "drain-soonest:v100-33=1h", "strict-fifo:T=5m",
                                 "aging-guard:heads=0", "drain-soonest:T", "fifo",
                                 more=NAMES.filter(lambda t: t.strip() not in ADMISSION_POLICIES)), [])
       for c in ("simulate", "plan")},
    ("history export", "--since"): (_bad("5x", "-1d", "yesterday"), []),
    ("history export", "--output"): (_bad("{folder}", "{file}/x", "{missing}/x"), []),
    ("history export", "--url"): (_bad("127.0.0.1:8888", "ftp://x"), []),
    ("plan", "--product"): (_bad("v100-33", more=NAMES.filter(lambda t: t not in (
        "all", "each", "v100-25", "v100-50", "v100-100", "v100-100x2", "v100-100x4"))), ["--jobs", "300"]),
    **{("simulate", o): (OUTPUT_BAD, []) for o in ("--json", "--csv", "--plots", "--out", "--placements")},
    **{("plan", o): (OUTPUT_BAD, []) for o in ("--json", "--plot")},
}
FREE = {  # options any text is a valid value of (or read only where the walk cannot go), and why
    ("serve", "--refuse-resource"): "any resource name",
    **{(c, "--server-name"): "any name; a wrong one fails the TLS handshake, with a hint" for c in ("status", "leave")},
    ("simulate", "--card-model"): "any GPU label", ("plan", "--card-model"): "any GPU label",
    ("history export", "--server-name"): "any name; a wrong one fails the TLS handshake, with a hint",
    ("simulate", "--scheduler"): "a Dask scheduler's address, checked when protocol A connects to it",
    **{(c, o): "read with the live cluster's snapshot (simulations/command_cluster.py; tests/unit/"
               "test_from_cluster.py): the walk stops before it"
       for c in ("simulate", "plan") for o in ("--from-cluster", "--history", "--since", "--ca", "--cert", "--key",
                                               "--server-name", "--remove-node", "--entitlements")},
    **{("agent", o): "the node agent reads it at start, after the thaw of what a crashed run left frozen "
                     "(enforcement/cli.py); in-process the walk runs --simulate, which refuses it"
       for o in ("--kubeconfig", "--catalog", "--hami-library", "--cgroup-root", "--proc-root", "--runtime-dir",
                 "--kubelet-dir", "--device-plugin-dir", "--cdi-dir", "--state-dir", "--nri-socket", "--limiter-dir",
                 "--limiter-source")},
}
# contexts that make the command valid on their own, for the "does not apply" walk ({...}: files)
CONTEXTS: dict[str, list[list[str]]] = {
    "simulate": [[], ["--protocol", "a"], ["--trace", "{trace}"], ["--pods", "{pods}", "--nodes", "{nodes}"],
                 ["--pods", "{pods}", "--protocol", "b"], ["--admission", "strict-fifo"],
                 ["--from-cluster", "{file}"]],
    "plan": [[], ["--trace", "{trace}"], ["--admission", "best-effort-fifo"], ["--from-cluster", "{file}"]],
    "agent": [["--node-name", "n"], ["--simulate"]],
    "serve": [[], ["--standalone", "--learn-nodes"], ["--standalone", "--demo"], ["--no-history"]],
}
RULES: dict[str, Callable[[], tuple[Applies | Conflict, ...]]] = {
    "simulate": lambda: (*command_cluster.RULES, *options.SIMULATE_RULES),
    "plan": lambda: (*command_cluster.RULES, *options.PLAN_RULES),
    "agent": lambda: agent_cli.RULES, "serve": lambda: tuple(extender_cli._rules()),
}
VALID_BY_TYPE: dict[Any, str] = {
    argtypes.positive_int: "2", argtypes.non_negative_int: "1", argtypes.port: "18999",
    argtypes.positive_number: "1", argtypes.non_negative_number: "1", options.parse_duration: "5m",
    options.parse_cap: "2d", options.parse_rho: "0.9", options.parse_rhos: "0.9", options.parse_load: "1.1",
    options.parse_inflation: "1.2",
    options.processes: "1", simulated_gpus: "2", agent_cli._listen: "127.0.0.1:0", _limiter_mode: "gpuslice",
    Path: "{folder}", simulations_cli.plan_target: "10m", command_cluster.parse_add_cards: "8",
    command_cluster._positive: "2", extender_cli._linger: "0",
}
VALID_BY_OPTION = {"--nodes": "{nodes}", "--pods": "{pods}", "--trace": "{trace}", "--runtimes-from": "{pods}",
                   "--catalog": "{catalog}", "--kubeconfig": "{file}", "--admission": "aging-guard",
                   "--placements": "{out}/p.csv", "--gpu-model": "Tesla-V100-SXM2-32GB", "--node-name": "n",
                   "--hami-library": "/x.so", "--from-cluster": "{file}", "--history": "{file}", "--since": "7d",
                   "--ca": "{file}", "--cert": "{file}", "--key": "{file}", "--server-name": "x", "--remove-node": "n",
                   "--entitlements": "{file}", "--scheduler": "tcp://127.0.0.1:1"}


# ---- the parsers, and running a command -----------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(command: str) -> argparse.ArgumentParser:
    """The parser ``gpuslice <command>`` builds, caught as it is about to parse (nothing runs)."""

    def caught(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Parsed(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", caught)
        try:
            _load(SUBCOMMANDS[command][0])([])
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError(f"gpuslice {command} never parsed its arguments")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by the words that name it ('simulate', 'history export')."""
    out = {}
    for command in sorted(SUBCOMMANDS):
        parser = out[command] = parser_of(command)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update({f"{command} {name}": sub for name, sub in action.choices.items()})
    return out


PARSERS = _parsers()


def options_of(command: str) -> list[argparse.Action]:
    return [a for a in PARSERS[command]._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def name_of(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def bad_values(command: str, action: argparse.Action) -> tuple[Bad, list[str]] | None:
    """Wrong values for the option and the context they are tried in; None when it takes none to walk."""
    option = name_of(action)
    if (command, option) in BAD_BY_OPTION:
        return BAD_BY_OPTION[(command, option)]
    if action.nargs == 0 or ((command, option) in FREE and action.type is None):
        return None
    context = ["--protocol", "a"] if option in options.PROTOCOL_A_ONLY and command == "simulate" else []
    if command == "agent":
        context = ["--simulate"] if option in agent_cli.SIMULATION_ONLY else ["--node-name", "n"]
    if command == "serve":
        context = ["--standalone", "--nodes", "1"]
    if action.type in BAD_BY_TYPE:
        return BAD_BY_TYPE[action.type], context
    if action.type in FILE_TYPES:
        return FILE_BAD, context
    if action.choices is not None:
        choices = list(action.choices)
        return _bad("bogus", more=WORDS.filter(lambda t: t not in choices)), context
    if (command, option) in FREE:
        return None
    raise KeyError(f"gpuslice {command} {option}")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("cli-walk")
    made = {"nodes": "sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,8,V100M32\n",
            "pods": "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                    "scheduled_time\n" + "".join(f"p{i},1000,1024,1,500,,LS,Running,{i},{i + 900},{i}\n"
                                                  for i in range(40)),
            "trace": "arrival,duration,product\n" + "".join(f"{i},600,v100-25\n" for i in range(40)),
            "file": "x"}
    paths = {"missing": str(base / "missing.csv"), "folder": str(base), "out": str(base / "out")}
    for name, text in made.items():
        (base / name).write_text(text)
        paths[name] = str(base / name)
    (base / "binary").write_bytes(bytes(range(128, 256)))
    paths["binary"] = str(base / "binary")
    paths["catalog"] = str(Path(argtypes.__file__).parent / "catalog.toml")
    return paths


@pytest.fixture(scope="module")
def nothing_runs() -> Iterator[None]:
    """Whatever would start work raises Accepted (a bad value got through); the rest is real."""
    with pytest.MonkeyPatch.context() as mp:
        for target in ("packing.demo.run", "extender.demo.run_demo", "extender.client.ExtenderClient.request_raw",
                       "simulations.command_cluster.simulate_from_cluster",
                       "simulations.command_cluster.plan_from_cluster",
                       "gunicorn.app.base.BaseApplication.run", "extender.queue_view.operator_kube",
                       "extender.gates.operator_kube", "extender.slices.operator_kube",
                       "extender.certs.cli.operator_kube",
                       "enforcement.cli._run_node", "enforcement.simulate.run_demo", "simulations.protocol_b.run",
                       "simulations.command_a.execute", "simulations.cli.smallest_cards"):
            mp.setattr(target, _accepted)
        mp.setattr("extender.queue_view.current_namespace", lambda kubeconfig="": "default")
        mp.setattr("extender.gates.current_namespace", lambda kubeconfig="": "default")

        def listen(host: str, port: int) -> None:
            extender_cli.listen_address(host, port)  # a bad --host is refused here; a good one would serve
            raise Accepted

        mp.setattr(extender_cli, "_check_listen", listen)
        for variable in [v for v in os.environ if v.startswith("GPUSLICE_")]:
            mp.delenv(variable)
        yield


def refusal(argv: list[str]) -> tuple[int, str]:
    """``gpuslice ARGV`` in-process: (exit status, stderr); Accepted when it went on to run."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = gpuslice(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def check(argv: list[str], flag: str) -> None:
    """The rule: refused with 2 or 1, at most 3 lines on stderr, no traceback, ``flag`` named."""
    try:
        code, err = refusal(argv)
    except Accepted:
        pytest.fail(f"accepted: gpuslice {' '.join(map(repr, argv))}")
    lines = err.strip().splitlines()
    assert code in (1, 2), (argv, code, err)
    assert 1 <= len(lines) <= 3 and "Traceback" not in err, (argv, err)
    assert flag in err, (argv, flag, err)


def fill(text: str, files: dict[str, str]) -> str:
    return text.format(**files) if "{" in text and "}" in text else text


WALKED = [(command, action) for command in PARSERS for action in options_of(command)
          if action.dest != "debug" and not isinstance(action, argparse.BooleanOptionalAction)]


# ---- the properties --------------------------------------------------------------------------------


def test_every_option_is_walked() -> None:
    unknown = []
    for command, action in WALKED:
        try:
            bad_values(command, action)
        except KeyError:
            unknown.append(f"gpuslice {command} {name_of(action)}")
    assert not unknown, ("tell this file how to make these options' values wrong (a type in BAD_BY_TYPE, or "
                         f"BAD_BY_OPTION, or FREE with the reason): {unknown}")
    for command, parser in PARSERS.items():
        assert isinstance(parser, CommandParser), f"gpuslice {command}: build its parser with packing.usage"


def test_every_rule_names_options_that_exist() -> None:
    """A typo in a rule would make it never fire: each option it names is some command's (rules are shared)."""
    every = {o for c in RULES for o in PARSERS[c]._option_string_actions}
    for command, rules in RULES.items():
        for rule in rules():
            flags = (rule.first, rule.second) if isinstance(rule, Conflict) else rule.flags
            assert set(flags) <= every, f"gpuslice {command}: a rule names {set(flags) - every}, no command's option"


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(("command", "option"), [(c, name_of(a)) for c, a in WALKED])
def test_a_known_bad_value_of_each_option_is_refused(command: str, option: str, files: dict[str, str]) -> None:
    action = next(a for a in options_of(command) if name_of(a) == option)
    walk = bad_values(command, action)
    if walk is None:
        return  # a flag (the "does not apply" walk takes it) or free text
    bad, context = walk
    for value in bad.examples:
        check([*command.split(), *(fill(c, files) for c in context), f"{option}={fill(value, files)}"], option)


@pytest.mark.usefixtures("nothing_runs")
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bad_value_of_any_option_is_refused_in_one_line_naming_it(data: st.DataObject,
                                                                      files: dict[str, str]) -> None:
    command, action = data.draw(st.sampled_from(WALKED), label="option")
    walk = bad_values(command, action)
    assume(walk is not None)
    assert walk is not None
    bad, context = walk
    value = fill(data.draw(bad.strategy, label="value"), files)
    option = name_of(action)
    check([*command.split(), *(fill(c, files) for c in context), f"{option}={value}"], option)


@pytest.mark.usefixtures("nothing_runs")
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_option_that_does_not_apply_is_refused_naming_it(data: st.DataObject, files: dict[str, str]) -> None:
    command = data.draw(st.sampled_from(sorted(RULES)), label="command")
    rule = data.draw(st.sampled_from(RULES[command]()), label="rule")
    parser = PARSERS[command]
    known = parser._option_string_actions  # one rule list may serve several commands: skip what this one lacks
    if isinstance(rule, Conflict):
        assume(rule.first in known and rule.second in known)
        argv = [command, *given_option(parser, rule.first, files), *given_option(parser, rule.second, files)]
        if command == "simulate" and "--trace" not in argv and "--pods" not in argv:
            argv += ["--trace", files["trace"]]
        check(argv, rule.first)
        return
    flag = data.draw(st.sampled_from(rule.flags), label="flag")
    assume(flag in known)
    context = [fill(c, files) for c in data.draw(st.sampled_from(CONTEXTS[command]), label="context")]
    argv = [*context, *given_option(parser, flag, files)]
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            assume(False)  # the option collides with the context itself (argparse says so): not this property
    assume(not rule.when(args))
    check([command, *argv], flag)


def given_option(parser: argparse.ArgumentParser, option: str, files: dict[str, str]) -> list[str]:
    """``option`` with a value it accepts, as a user would give it."""
    action = parser._option_string_actions[option]
    if action.nargs == 0:
        return [option]
    value = VALID_BY_OPTION.get(option) or VALID_BY_TYPE.get(action.type) or (
        next(iter(action.choices)) if action.choices else None)
    if value is None and action.type in FILE_TYPES:
        value = "{file}"
    assert value is not None, f"a valid value of {option} for the walk: add it to VALID_BY_OPTION or VALID_BY_TYPE"
    return [f"{option}={fill(str(value), files)}"]


@pytest.mark.usefixtures("nothing_runs")
@settings(max_examples=EXAMPLES // 3, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(PARSERS)), name=st.text(string.ascii_lowercase + "-", min_size=2, max_size=10))
def test_an_unknown_option_is_named(command: str, name: str) -> None:
    option = f"--{name.strip('-') or 'x'}"
    assume(not any(o.startswith(option) for o in PARSERS[command]._option_string_actions))
    assume(not any(isinstance(a, argparse._SubParsersAction) for a in PARSERS[command]._actions))
    check([*command.split(), option], option)
