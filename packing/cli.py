"""The ``gpuslice`` command: one entry point, subcommands owned by the package that does the work.

The table maps each subcommand to ``module:function``, imported only when that subcommand runs,
so ``packing`` never imports the extender, the agent or the simulator. Every subcommand runs
under :func:`packing.usage.guarded`: whatever it does not expect is one line and exit status 1.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence

from packing.usage import guarded

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("packing.demo:main", "pack a sample workload with every placement policy (no cluster)"),
    "serve": ("extender.cli:main", "run the kube-scheduler extender (--standalone: no cluster needed)"),
    "status": ("extender.cli:status_main", "print a running extender's ledger and queue"),
    "leave": ("extender.cli:leave_main", "tell a running extender to leave: not ready, leadership given up (preStop)"),
    "queue": ("extender.queue_view:main", "list the pods waiting for a slice: position, product, reason, waited"),
    "certs": ("extender.certs.cli:main", "make or renew the TLS certificates in Secrets, set the webhook's caBundle"),
    "history": ("extender.history.cli:main", "export the demand history a running extender keeps (JSON Lines)"),
    "gates": ("extender.gates:main", "list (or --lift) the pods still held by gpuslice's scheduling gate"),
    "slices": ("extender.slices:main", "list the pods that still use gpuslice (--refuse: fail naming them; "
                                       "--evict: evict them, fail naming those that stay)"),
    "agent": ("enforcement.cli:main", "run the node agent (--simulate: against a simulated GPU)"),
    "simulate": ("simulations.cli:simulate_main", "replay a trace through the packer and the queue"),
    "plan": ("simulations.cli:plan_main", "find the smallest card count that meets a wait target"),
}


def _usage() -> str:
    lines = ["usage: gpuslice <command> [options]", "       gpuslice --version", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\n'gpuslice <command> --help' (or 'gpuslice help <command>') explains each command; "
                 "--debug after any command prints the traceback of an unexpected error.")
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    try:
        return importlib.metadata.version("gpuslice")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


def _unknown(name: str) -> int:
    close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
    print(f"gpuslice: unknown command {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
          + f"; the commands: {', '.join(SUBCOMMANDS)}\n('gpuslice --help' lists every command)", file=sys.stderr)
    return 2


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module, _, func = target.partition(":")
    fn: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), func)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = []
    while args and args[0] == "--debug":  # `gpuslice --debug CMD ...` as well as `gpuslice CMD ... --debug`
        debug, args = ["--debug"], args[1:]
    if args[:1] in (["-V"], ["--version"]):
        print(f"gpuslice {version()}")
        return 0
    if args[:1] == ["help"] and len(args) > 1:
        args = [args[1], "--help"]
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:] + debug
    if name not in SUBCOMMANDS:
        return _unknown(name)
    try:
        fn = _load(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        print(f"gpuslice {name}: not available in this build ({e})", file=sys.stderr)
        return 2
    return guarded(f"gpuslice {name}", fn, rest)


if __name__ == "__main__":
    raise SystemExit(main())
