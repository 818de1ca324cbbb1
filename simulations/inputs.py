"""What ``gpuslice simulate`` and ``gpuslice plan`` read, and the job pool protocol B draws from it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from simulations import protocol_b
from simulations.options import UsageError
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import (
    Job,
    NodeSpec,
    OpenbPod,
    ReadReport,
    read_jobs,
    read_openb_nodes,
    read_openb_pods,
)
from simulations.workload import RuntimeCap, borrow_runtimes, openb_jobs

T = TypeVar("T")


@dataclass
class Inputs:
    """What the command reads: openb nodes/pods, our own trace, or nothing (built-in)."""

    description: str
    nodes: list[NodeSpec] | None = None
    pods: list[OpenbPod] | None = None  # the first pod list
    jobs: list[Job] | None = None
    reports: list[ReadReport] = field(default_factory=list)
    workloads: list[tuple[str, list[OpenbPod]]] = field(default_factory=list)  # every pod list, by file name

    @property
    def kind(self) -> str:
        """"openb" (pods read), "trace" (our own jobs read) or "builtin" (neither)."""
        if self.pods is not None:
            return "openb"
        return "trace" if self.jobs is not None else "builtin"

    def skipped(self) -> dict[str, int]:
        """Bad rows skipped, per file that had any."""
        return {r.path: r.skipped for r in self.reports if r.skipped}

    def print_skipped(self) -> None:
        """One line on stderr per file that had bad rows skipped, with the first reason."""
        for r in self.reports:
            if r.skipped:
                print(f"skipped {r.skipped} bad row(s) of {r.path}; first: {r.reasons[0]}", file=sys.stderr)


def load_inputs(args: argparse.Namespace) -> Inputs:
    """Read ``--nodes`` and ``--pods`` or ``--trace``; an empty file is bad usage."""
    strict = args.bad_rows == "error"
    if args.pods and args.trace:
        raise UsageError("give either --pods (openb) or --trace (our format), not both")
    inputs = Inputs("built-in synthetic workload")
    if args.nodes:
        inputs.nodes = _read(inputs, read_openb_nodes, args.nodes, strict, "nodes")
    if args.pods:
        for path in pod_files(args.pods):
            inputs.workloads.append((Path(path).name, _read(inputs, read_openb_pods, path, strict, "pods")))
        inputs.description, inputs.pods = inputs.workloads[0]
    elif args.trace:
        inputs.jobs = _read(inputs, read_jobs, args.trace, strict, "jobs")
        inputs.description = Path(args.trace).name
    return inputs


def pod_files(spec: str) -> list[str]:
    """``--pods``: one file, several comma-separated, or a folder (its ``openb_pod_list_*.csv``, sorted)."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path = Path(part)
        if path.is_dir():
            found = sorted(str(f) for f in path.glob("openb_pod_list_*.csv"))
            if not found:
                raise UsageError(f"{part}: no openb_pod_list_*.csv in this folder")
            out.extend(found)
        else:
            out.append(part)
    if not out:
        raise UsageError("--pods names no file")
    return out


def _read(inputs: Inputs, reader: Callable[[str, bool], tuple[list[T], ReadReport]], path: str, strict: bool,
          what: str) -> list[T]:
    """Rows of ``path`` (its read report kept in ``inputs``); none usable is bad usage."""
    rows, rep = reader(path, strict)
    inputs.reports.append(rep)
    if not rows:
        raise UsageError(f"{path}: no usable {what}")
    return rows


def cap_jobs(jobs: Sequence[Job], cap_s: float | None) -> tuple[list[Job], RuntimeCap]:
    """Our own trace's runtimes, capped like openb's (reported the same way)."""
    out: list[Job] = []
    capped = 0
    raw = kept = 0.0
    for j in jobs:
        if j.duration is None:
            out.append(j)
            continue
        d = j.duration if cap_s is None else min(j.duration, cap_s)
        capped += d < j.duration
        raw += j.duration * j.demand_milli / 1000
        kept += d * j.demand_milli / 1000
        out.append(replace(j, duration=d))
    return out, RuntimeCap(cap_s, len(jobs), len(out), 0, 0, capped, raw, kept)


def job_pool(args: argparse.Namespace, inputs: Inputs) -> tuple[protocol_b.PoolSource, RuntimeCap | None, str]:
    """The job pool for protocol B / plan: openb pods with capped runtimes, our trace, or synthetic."""
    if inputs.pods is not None:
        pods = inputs.pods
        if getattr(args, "runtimes_from", None):
            if args.arrivals != "poisson":
                raise UsageError("borrowed runtimes carry no arrival times: use --arrivals poisson")
            donors, rep = read_openb_pods(args.runtimes_from, args.bad_rows == "error")
            inputs.reports.append(rep)
            pods = borrow_runtimes(pods, donors)
        jobs, cap = openb_jobs(pods, args.runtime_cap, args.never_ran)
    elif inputs.jobs is not None:
        jobs, cap = cap_jobs(inputs.jobs, args.runtime_cap)
    else:
        return _synthetic_pool(args)
    description = inputs.description
    if args.max_job_cards is not None:
        kept = [j for j in jobs if j.count <= args.max_job_cards]
        description += f", jobs of <= {args.max_job_cards} card(s) ({len(jobs) - len(kept)} larger dropped)"
        jobs = kept
    return jobs, cap, description


def _synthetic_pool(args: argparse.Namespace) -> tuple[protocol_b.PoolSource, None, str]:
    """The built-in synthetic workload, generated per seed."""
    cards = args.cards or protocol_b.DEFAULT_CARDS
    rho = args.rho if args.rho is not None else 0.85
    n = args.jobs or 20000

    def synthetic(seed: int) -> list[Job]:
        return generate(SyntheticSpec(cards=cards, rho=rho, jobs=n, runtime_cap_s=args.runtime_cap or 1e12), seed)

    return synthetic, None, f"built-in synthetic ({n} jobs per seed)"
