"""The ``gpuslice`` command: one entry point, subcommands owned by the package that does the work.

The table maps each subcommand to ``module:function``, imported only when that subcommand runs,
so ``packing`` never imports the extender, the agent or the simulator.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("packing.demo:main", "pack a sample workload with every placement policy (no cluster)"),
    "serve": ("extender.cli:main", "run the kube-scheduler extender (--standalone: no cluster needed)"),
    "status": ("extender.cli:status_main", "print a running extender's ledger and queue"),
    "queue": ("extender.queue_view:main", "list the pods waiting for a slice: position, product, reason, waited"),
    "certs": ("extender.certs.cli:main", "make or renew the TLS certificates in Secrets, set the webhook's caBundle"),
    "history": ("extender.history.cli:main", "export the demand history a running extender keeps (JSON Lines)"),
    "gates": ("extender.gates:main", "list (or --lift) the pods still held by gpuslice's scheduling gate"),
    "agent": ("enforcement.cli:main", "run the node agent (--simulate: against a simulated GPU)"),
    "simulate": ("simulations.cli:simulate_main", "replay a trace through the packer and the queue"),
    "plan": ("simulations.cli:plan_main", "find the smallest card count that meets a wait target"),
}


def _usage() -> str:
    lines = ["usage: gpuslice <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\n'gpuslice <command> --help' explains each command.")
    return "\n".join(lines)


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module, _, func = target.partition(":")
    fn: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), func)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"gpuslice: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        fn = _load(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        print(f"gpuslice {name}: not available in this build ({e})", file=sys.stderr)
        return 2
    try:
        return fn(rest)
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as cat and kubectl do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, the shell's status for it


if __name__ == "__main__":
    raise SystemExit(main())
