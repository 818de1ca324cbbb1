"""``gpuslice simulate`` and ``gpuslice plan``: the simulator's command line (contract in README.md).

Without input files both run on the built-in synthetic workload. ``--nodes NODES.csv --pods
PODS.csv`` reads Alibaba ``openb`` files; ``--trace JOBS.csv|.jsonl`` reads our own format.
Exit status: 0 done, 2 bad usage or bad input (the message names the file and line).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packing.policies import DEFAULT_POLICY, POLICIES
from packing.products import Catalog, CatalogError, Request, load_catalog
from packing.queue import ADMISSION_POLICIES, AGING_GUARD, DEFAULT_AGE_LIMIT
from simulations import metrics, protocol_a, protocol_b, registry, report
from simulations.cluster import DEFAULT_CARD_LABEL, CardModel, ClusterError, card_model_for, card_nodes
from simulations.engine import EngineConfig, EngineError
from simulations.progress import Progress
from simulations.scheduler import SCORES, TIES, SchedulerError, SchedulerModel
from simulations.sizing import SizingError, lower_bound_cards, smallest_cards
from simulations.synthetic import SyntheticError, SyntheticSpec, generate
from simulations.traces import (
    Job,
    NodeSpec,
    OpenbPod,
    ReadReport,
    TraceError,
    read_jobs,
    read_openb_nodes,
    read_openb_pods,
)
from simulations.workload import DEFAULT_RUNTIME_CAP_S, ROUNDINGS, RuntimeCap, WorkloadError, job_request, openb_jobs

PLAN_JOBS = 5000  # per seed and card count: the search runs the workload a dozen times
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_ERRORS = (TraceError, CatalogError, ClusterError, EngineError, SchedulerError, SyntheticError, WorkloadError,
           SizingError, protocol_b.ProtocolBError, ValueError)


class UsageError(ValueError):
    """Bad command-line usage (mutually exclusive or missing options)."""


# ---- argument parsing ------------------------------------------------------------------------------


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``1,2,5`` or ``7``; ranges inclusive."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(-?\d+)-(-?\d+)", part)
        try:
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds must look like 42-51 or 1,2,3, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return tuple(seeds)


def parse_duration(text: str) -> float:
    """Seconds, or a number with a unit: 90s, 15m, 2h, 2d."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"duration must look like 3600, 90s, 15m, 2h or 2d, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_cap(text: str) -> float | None:
    return None if text.strip().lower() in ("none", "off", "0") else parse_duration(text)


def parse_rho(text: str) -> float | None:
    if text.strip().lower() in ("none", "trace", "keep"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"offered load must be a number or 'none', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"offered load must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _workload_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("workload (default: the built-in synthetic workload)")
    g.add_argument("--nodes", metavar="NODES.csv", help="openb node list (openb_node_list_*.csv)")
    g.add_argument("--pods", metavar="PODS.csv", help="openb pod list (openb_pod_list_*.csv)")
    g.add_argument("--trace", metavar="JOBS", help="our own trace format, CSV or .jsonl (see simulations/README.md)")
    g.add_argument("--bad-rows", choices=("error", "skip"), default="error",
                   help="a bad row stops with file:line (error, default) or is skipped and counted (skip)")
    g.add_argument("--catalog", metavar="TOML", help="product catalog (default: the built-in V100 catalog)")
    g.add_argument("--card-model", default=DEFAULT_CARD_LABEL,
                   help=f"GPU label every card gets when requests are slices (default {DEFAULT_CARD_LABEL})")
    g.add_argument("--rounding", choices=ROUNDINGS, help="free-form milli (none) or rounded up to catalog slices "
                   "(slices); default: none for protocol A, slices for B")
    g.add_argument("--jobs", type=_positive_int, help="jobs to generate or resample (protocol B, plan)")
    g.add_argument("--runtime-cap", type=parse_cap, default=DEFAULT_RUNTIME_CAP_S, metavar="DUR",
                   help="cap runtimes (the openb tail is truncated at the trace's end); 'none' to keep (default 2d)")
    g.add_argument("--never-ran", choices=("drop", "sample"), default="drop",
                   help="openb pods never scheduled: drop them, or sample a runtime (default drop)")


def _scheduler_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("placement and the path through kube-scheduler")
    g.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"placement policy, or several comma-separated (default {DEFAULT_POLICY}); "
                   "one of: " + ", ".join(registry.policy_names()))
    g.add_argument("--ties", choices=TIES, default="stable",
                   help="node-score ties: per-seed fixed node order (stable, FGD's artifact) or random (upstream)")
    g.add_argument("--scores", choices=SCORES, default="exact",
                   help="compare exact keys, or only the extender's 0..10 levels (extender)")
    g.add_argument("--seeds", type=parse_seeds, help="e.g. 42-51 (default: 42-51 for protocol A, 1-3 for B)")


def _queue_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("protocol B: queue and load")
    g.add_argument("--admission", default=AGING_GUARD,
                   help=f"queue admission policy, or several comma-separated (default {AGING_GUARD}); "
                   f"one of: {', '.join(ADMISSION_POLICIES)}")
    g.add_argument("--rho", type=parse_rho, default=0.85, help="target offered load (default 0.85); 'none' keeps "
                   "the workload's own timing")
    g.add_argument("--arrivals", choices=protocol_b.ARRIVALS, default="poisson",
                   help="resample into a Poisson stream (default) or compress the trace's own arrival times")
    g.add_argument("--cards", type=_positive_int, help="a cluster of N V100 cards, 8 per node, instead of --nodes "
                   f"(default {protocol_b.DEFAULT_CARDS} without --nodes)")
    g.add_argument("--host", action="store_true", help="track node CPU/RAM in protocol B (default: GPU only)")
    g.add_argument("--max-job-cards", type=_positive_int, metavar="N",
                   help="drop jobs asking for more than N cards (reported); e.g. 1 for single-card jobs only")
    g.add_argument("--age-limit", type=parse_duration, default=DEFAULT_AGE_LIMIT, metavar="DUR",
                   help="aging guard's T (default 60m)")
    g.add_argument("--sla", type=parse_duration, default=metrics.DEFAULT_SLA_S, metavar="DUR",
                   help="waits above this count as starvation (default 60m)")
    g.add_argument("--reservation-ttl", type=parse_duration, metavar="DUR",
                   help="admission reserves for this long instead of committing at once")
    g.add_argument("--bind-delay", type=parse_duration, default=0.0, metavar="DUR",
                   help="admission to bind (needs --reservation-ttl; a longer delay lets reservations lapse)")
    g.add_argument("--declare-limits", action="store_true",
                   help="jobs declare their runtime as an enforced limit (lets the aging guard backfill)")


def _output_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the results as JSON")
    g.add_argument("--csv", metavar="PATH", help="write the results table as CSV")
    g.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    g.add_argument("--out", metavar="DIR", help="write results.json, results.csv and the plots into DIR")
    g.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a terminal")


# ---- workload loading ------------------------------------------------------------------------------


@dataclass
class Inputs:
    """What the command reads: openb nodes/pods, our own trace, or nothing (built-in)."""

    kind: str  # "openb", "trace" or "builtin"
    description: str
    nodes: list[NodeSpec] | None = None
    pods: list[OpenbPod] | None = None
    jobs: list[Job] | None = None
    reports: list[ReadReport] = field(default_factory=list)

    def skipped(self) -> dict[str, int]:
        return {r.path: r.skipped for r in self.reports if r.skipped}


def load_inputs(args: argparse.Namespace) -> Inputs:
    strict = args.bad_rows == "error"
    if args.pods and args.trace:
        raise UsageError("give either --pods (openb) or --trace (our format), not both")
    inputs = Inputs("builtin", "built-in synthetic workload")
    if args.nodes:
        nodes, rep = read_openb_nodes(args.nodes, strict)
        inputs.nodes = nodes
        inputs.reports.append(rep)
        if not nodes:
            raise UsageError(f"{args.nodes}: no usable nodes")
    if args.pods:
        pods, rep = read_openb_pods(args.pods, strict)
        inputs.kind, inputs.description, inputs.pods = "openb", Path(args.pods).name, pods
        inputs.reports.append(rep)
        if not pods:
            raise UsageError(f"{args.pods}: no usable pods")
    elif args.trace:
        jobs, rep = read_jobs(args.trace, strict)
        inputs.kind, inputs.description, inputs.jobs = "trace", Path(args.trace).name, jobs
        inputs.reports.append(rep)
        if not jobs:
            raise UsageError(f"{args.trace}: no usable jobs")
    return inputs


def _catalog(args: argparse.Namespace) -> Catalog:
    return load_catalog(args.catalog)


def _model(args: argparse.Namespace) -> SchedulerModel:
    return SchedulerModel(ties=args.ties, scores=args.scores)


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"no {what} given")
    for n in names:
        if n not in known:
            raise UsageError(f"unknown {what} {n!r}; choose one of {', '.join(known)}")
    return names


def _policies(args: argparse.Namespace) -> list[str]:
    if getattr(args, "compare", False):
        return list(POLICIES)
    return _names(args.policy, list(POLICIES), "policy")


def _admissions(args: argparse.Namespace) -> list[str]:
    if getattr(args, "compare", False):
        return list(ADMISSION_POLICIES)
    return _names(args.admission, ADMISSION_POLICIES, "admission policy")


def _outputs(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    json_path, csv_path, plots = args.json, args.csv, args.plots
    if args.out:
        out = Path(args.out)
        json_path = json_path or str(out / "results.json")
        csv_path = csv_path or str(out / "results.csv")
        plots = plots or str(out)
    return json_path, csv_path, plots


def _cap_jobs(jobs: Sequence[Job], cap_s: float | None) -> tuple[list[Job], RuntimeCap]:
    """Our own trace's runtimes, capped like openb's (reported the same way)."""
    from dataclasses import replace

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


# ---- simulate --------------------------------------------------------------------------------------


def simulate_main(argv: Sequence[str]) -> int:
    """``gpuslice simulate``: protocol A or B on a trace or the built-in workload."""
    ap = argparse.ArgumentParser(
        prog="gpuslice simulate",
        description="Replay a workload through the packing ledger, policies and queue the extender uses. "
                    "Protocol A: FGD's benchmark (no departures, inflated to 130 %%). Protocol B: departures and "
                    "the queue, waits per product. Without --pods/--trace: the built-in synthetic workload.",
        epilog="Exit status: 0 done, 2 bad usage or bad input (the message names the file and line).")
    ap.add_argument("--protocol", choices=("a", "b"),
                    help="a: FGD-compatible (no departures, 130 %% inflation); b: departures and the queue. "
                         "Default: a with --pods, b otherwise")
    ap.add_argument("--compare", action="store_true",
                    help="every placement policy (and in B every admission policy) side by side")
    ap.add_argument("--inflation", type=float, default=protocol_a.DEFAULT_INFLATION,
                    help="protocol A: workload inflated to this multiple of GPU capacity (default 1.3)")
    _workload_options(ap)
    _scheduler_options(ap)
    _queue_options(ap)
    _output_options(ap)
    args = ap.parse_args(list(argv))
    try:
        inputs = load_inputs(args)
        protocol = args.protocol or ("a" if inputs.kind == "openb" else "b")
        if protocol == "a":
            return _simulate_a(args, inputs)
        return _simulate_b(args, inputs)
    except UsageError as e:
        ap.print_usage(sys.stderr)
        print(f"gpuslice simulate: error: {e}", file=sys.stderr)
        return 2
    except _ERRORS as e:
        print(f"gpuslice simulate: error: {e}", file=sys.stderr)
        return 2


def _requests_a(args: argparse.Namespace, inputs: Inputs, catalog: Catalog,
                rounding: str) -> tuple[list[NodeSpec], list[Request], CardModel]:
    if inputs.kind == "openb":
        if inputs.nodes is None:
            raise UsageError("protocol A on openb pods needs --nodes (openb_node_list_gpu_node.csv)")
        assert inputs.pods is not None
        return inputs.nodes, protocol_a.pod_requests(inputs.pods, catalog, rounding), \
            card_model_for(catalog, rounding, args.card_model)
    jobs = inputs.jobs if inputs.jobs is not None else generate(SyntheticSpec(cards=args.cards or 64,
                                                                              jobs=args.jobs or 2000), 0)
    nodes = inputs.nodes or card_nodes(args.cards or protocol_b.DEFAULT_CARDS, label=args.card_model)
    requests = [job_request(j, catalog, rounding) for j in jobs]
    return nodes, requests, protocol_b.card_for(catalog, rounding, requests)


def _simulate_a(args: argparse.Namespace, inputs: Inputs) -> int:
    catalog = _catalog(args)
    rounding = args.rounding or "none"
    seeds = args.seeds or protocol_a.DEFAULT_SEEDS
    nodes, requests, card = _requests_a(args, inputs, catalog, rounding)
    results: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    policies = _policies(args)
    bar = Progress("protocol A", True if args.progress else None)
    for k, name in enumerate(policies):
        config = protocol_a.ProtocolAConfig(policy=name, rounding=rounding, model=_model(args),
                                            inflation=args.inflation, track_host=inputs.kind == "openb")
        done = protocol_a.run(nodes, requests, card, config, seeds, _stepper(bar, k, len(policies)))
        results[name] = protocol_a.summarize(done)
        runs.extend({k2: v for k2, v in r.as_dict().items() if k2 != "curve"} for r in done)
    bar.close()
    # the published numbers are for free-form sizes under the artifact's stable tie-breaking
    comparable = inputs.description == "openb_pod_list_default.csv" and rounding == "none" and \
        args.ties == "stable" and args.inflation == protocol_a.DEFAULT_INFLATION
    published = report.PUBLISHED_DEFAULT if comparable else {}
    header = {"trace": inputs.description, "rounding": rounding, "ties": args.ties, "scores": args.scores,
              "seeds": _seed_text(seeds), "published": published}
    print(report.protocol_a_text(results, header))
    _print_skipped(inputs)
    main = results[policies[0]]
    data = {
        "protocol": "a",
        "workload": inputs.description,
        "nodes": len(nodes),
        "cards": sum(n.gpus for n in nodes),
        "rounding": rounding,
        "ties": args.ties,
        "scores": args.scores,
        "inflation": args.inflation,
        "seeds": list(seeds),
        "policy": policies[0],
        "unallocated_gpu_pct_at_100": main["unallocated_gpu_pct_at_100"],
        "unallocated_gpu_pct_at_100_sd": main["unallocated_gpu_pct_at_100_sd"],
        "policies": results,
        "runs": runs,
        "published_unallocated_gpu_pct_at_100": published,
        "skipped_rows": inputs.skipped(),
    }
    json_path, csv_path, plots_dir = _outputs(args)
    if json_path:
        report.write_json(json_path, data)
    if csv_path:
        report.write_csv(csv_path, report.protocol_a_rows(results))
    if plots_dir:
        from simulations import plots

        plots.allocation_vs_arrived({p: s["curve"] for p, s in results.items()},
                                    Path(plots_dir) / "allocation_vs_arrived.png",
                                    f"protocol A: {inputs.description} ({rounding}, ties {args.ties})")
    return 0


def _pool_b(args: argparse.Namespace, inputs: Inputs) -> tuple[protocol_b.PoolSource, RuntimeCap | None, str]:
    """The job pool for protocol B / plan: openb pods with capped runtimes, our trace, or synthetic."""
    if inputs.kind in ("openb", "trace"):
        if inputs.kind == "openb":
            assert inputs.pods is not None
            jobs, cap = openb_jobs(inputs.pods, args.runtime_cap, args.never_ran)
        else:
            assert inputs.jobs is not None
            jobs, cap = _cap_jobs(inputs.jobs, args.runtime_cap)
        description = inputs.description
        if args.max_job_cards is not None:
            kept = [j for j in jobs if j.count <= args.max_job_cards]
            description += f", jobs of <= {args.max_job_cards} card(s) ({len(jobs) - len(kept)} larger dropped)"
            jobs = kept
        return jobs, cap, description
    cards = args.cards or protocol_b.DEFAULT_CARDS
    rho = args.rho if args.rho is not None else 0.85
    n = args.jobs or 20000

    def synthetic(seed: int) -> list[Job]:
        return generate(SyntheticSpec(cards=cards, rho=rho, jobs=n, runtime_cap_s=args.runtime_cap or 1e12), seed)

    return synthetic, None, f"built-in synthetic ({n} jobs)"


def _engine(args: argparse.Namespace, policy: str, admission: str) -> EngineConfig:
    return EngineConfig(policy=policy, admission=admission, model=_model(args), age_limit_s=args.age_limit,
                        reservation_ttl_s=args.reservation_ttl, bind_delay_s=args.bind_delay,
                        declare_limits=args.declare_limits)


def _simulate_b(args: argparse.Namespace, inputs: Inputs) -> int:
    catalog = _catalog(args)
    rounding = args.rounding or "slices"
    seeds = args.seeds or protocol_b.DEFAULT_SEEDS
    source, cap, description = _pool_b(args, inputs)
    builtin = inputs.kind == "builtin"
    nodes = inputs.nodes if inputs.nodes is not None and not args.cards else None
    cards = None if nodes is not None else (args.cards or protocol_b.DEFAULT_CARDS)
    policies = _policies(args)
    admissions = _admissions(args)
    combos = [(p, a) for p in policies for a in admissions]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    sims: dict[str, list[Any]] = {}
    bar = Progress("protocol B", True if args.progress else None)
    for k, (policy, admission) in enumerate(combos):
        config = protocol_b.ProtocolBConfig(engine=_engine(args, policy, admission), rounding=rounding,
                                            rho=None if builtin else args.rho, arrivals=args.arrivals,
                                            jobs=args.jobs, sla_s=args.sla)
        result = protocol_b.run(source, catalog, config, seeds, nodes=nodes, cards=cards, track_host=args.host,
                                progress=_stepper(bar, k, len(combos)))
        results[(policy, admission)] = result.pooled()
        sims[f"{policy}+{admission}"] = result.simulations
    bar.close()
    first = next(iter(results.values()))
    header = {"workload": description, "cards": first["cards"], "offered_load": first["offered_load"],
              "rounding": rounding, "ties": args.ties, "scores": args.scores, "seeds": _seed_text(seeds),
              "runtime_cap": cap.as_dict() if cap else None}
    print(report.protocol_b_text(results, header))
    _print_skipped(inputs)
    data = {
        "protocol": "b",
        "workload": description,
        "cards": first["cards"],
        "rounding": rounding,
        "ties": args.ties,
        "scores": args.scores,
        "seeds": list(seeds),
        "rho_target": None if builtin else args.rho,
        "arrivals": args.arrivals,
        "runtime_cap": cap.as_dict() if cap else {"runtime_cap_s": args.runtime_cap},
        "runs": [{"policy": p, "admission": a, **r} for (p, a), r in results.items()],
        "skipped_rows": inputs.skipped(),
    }
    json_path, csv_path, plots_dir = _outputs(args)
    if json_path:
        report.write_json(json_path, data)
    if csv_path:
        report.write_csv(csv_path, report.protocol_b_rows(results))
    if plots_dir:
        from simulations import plots

        d = Path(plots_dir)
        plots.wait_cdf(sims, d / "wait_cdf.png", f"waits per product: {description}")
        window = sims[next(iter(sims))][0].window
        plots.utilisation({k: r["utilisation_over_time_pct"] for k, r in
                           zip(sims, results.values(), strict=True)}, window[1] - window[0],
                          d / "utilisation.png", f"utilisation over time: {description}")
        plots.fragmentation(dict(zip(sims, results.values(), strict=True)), d / "fragmentation.png",
                            f"fragmentation: {description}")
    return 0


def _stepper(bar: Progress, k: int, parts: int) -> Callable[[int, int], None]:
    """Progress of part ``k`` of ``parts`` equal parts, as one bar."""

    def step(done: int, total: int) -> None:
        bar.update(k * total + done, total * parts)

    return step


def _seed_text(seeds: Sequence[int]) -> str:
    s = list(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s))


def _print_skipped(inputs: Inputs) -> None:
    for r in inputs.reports:
        if r.skipped:
            print(f"skipped {r.skipped} bad row(s) of {r.path}; first: {r.reasons[0]}", file=sys.stderr)


# ---- plan ------------------------------------------------------------------------------------------


def plan_main(argv: Sequence[str]) -> int:
    """``gpuslice plan``: the smallest card count whose wait percentile meets a target."""
    ap = argparse.ArgumentParser(
        prog="gpuslice plan",
        description="Find the smallest number of cards whose wait percentile meets a target, by bisection "
                    "over protocol B runs of a fixed workload (built-in synthetic by default).")
    ap.add_argument("--target", type=parse_duration, default=600.0, metavar="DUR",
                    help="wait target (default 10m)")
    ap.add_argument("--percentile", type=float, default=95.0, help="wait percentile to hold (default 95)")
    ap.add_argument("--product", default="all",
                    help="product the target applies to: a product name, 'all' jobs (default) or 'each' product")
    ap.add_argument("--max-cards", type=_positive_int, default=4096, help="give up above this many (default 4096)")
    ap.add_argument("--ref-cards", type=_positive_int, default=protocol_b.DEFAULT_CARDS,
                    help="the workload offers --rho to this many cards (default 64)")
    _workload_options(ap)
    _scheduler_options(ap)
    _queue_options(ap)
    ap.add_argument("--json", metavar="PATH", help="write the answer and the curve as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write the curve as PNG")
    ap.add_argument("--progress", action="store_true", help="progress on stderr even when not a terminal")
    args = ap.parse_args(list(argv))
    try:
        if not 0 <= args.percentile <= 100:
            raise UsageError(f"--percentile must be within 0..100, got {args.percentile}")
        return _plan(args)
    except UsageError as e:
        ap.print_usage(sys.stderr)
        print(f"gpuslice plan: error: {e}", file=sys.stderr)
        return 2
    except _ERRORS as e:
        print(f"gpuslice plan: error: {e}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    inputs = load_inputs(args)
    catalog = _catalog(args)
    rounding = args.rounding or "slices"
    seeds = args.seeds or protocol_b.DEFAULT_SEEDS
    args.cards = args.cards or args.ref_cards
    args.jobs = args.jobs or PLAN_JOBS
    source, _, description = _pool_b(args, inputs)
    builtin = inputs.kind == "builtin"
    (policy,), (admission,) = _one(_policies(args), "policy"), _one(_admissions(args), "admission policy")
    config = protocol_b.ProtocolBConfig(engine=_engine(args, policy, admission), rounding=rounding,
                                        rho=None if builtin else args.rho, arrivals=args.arrivals,
                                        jobs=args.jobs, sla_s=args.sla)
    # the workload is fixed (shaped against --ref-cards); only the cluster changes
    workloads = [protocol_b.seed_workload(source, catalog, config, 1000 * args.ref_cards, s) for s in seeds]
    fixed = protocol_b.ProtocolBConfig(engine=config.engine, rounding=rounding, rho=None, sla_s=args.sla)
    work = max(sum(r.total_milli * (j.duration or 0.0) for j, r in zip(jobs, reqs, strict=True))
               / max(1e-9, jobs[-1].arrival - jobs[0].arrival) for jobs, reqs, _ in workloads)
    low = lower_bound_cards(work, 1.0)
    bar = Progress("plan", True if args.progress else None)
    evaluated = [0]

    def wait_at(cards: int) -> float:
        sims = []
        for (jobs, _, _), seed in zip(workloads, seeds, strict=True):
            res = protocol_b.run(jobs, catalog, fixed, [seed], cards=cards, track_host=args.host)
            sims.extend(res.simulations)
        evaluated[0] += 1
        bar.update(evaluated[0], evaluated[0] + 1)
        return _plan_metric(sims, args.percentile, args.product)

    sizing = smallest_cards(wait_at, args.target, low, args.max_cards, start=max(args.ref_cards, low + 1))
    bar.close()
    label = f"p{args.percentile:g} ({args.product})"
    print(f"plan: {description}, {policy} + {admission}, ties {args.ties}, seeds {_seed_text(seeds)}; "
          f"offered work needs at least {low} cards")
    print(report.plan_text(sizing.curve(), sizing.cards, args.target, label))
    if args.json:
        report.write_json(args.json, {
            "workload": description, "policy": policy, "admission": admission, "percentile": args.percentile,
            "product": args.product, "target_s": args.target, "lower_bound_cards": low, "cards": sizing.cards,
            "curve": [{"cards": n, "wait_s": w} for n, w in sizing.curve()], "seeds": list(seeds),
        })
    if args.plot:
        from simulations import plots

        plots.sizing_curve(sizing.curve(), args.target, sizing.cards, args.plot, f"sizing: {description}")
    return 0 if sizing.cards is not None else 1


def _one(names: list[str], what: str) -> list[str]:
    if len(names) != 1:
        raise UsageError(f"plan sizes for one {what} at a time, got {', '.join(names)}")
    return names


def _plan_metric(sims: Sequence[Any], q: float, product: str) -> float:
    """The pooled wait percentile of ``product`` ('all', or the worst over 'each' product)."""
    per: dict[str, list[float]] = {}
    for sim in sims:
        for cls, a, s in zip(sim.job_class, sim.arrival, sim.start, strict=True):
            per.setdefault(sim.classes[cls], []).append(s - a)  # never started: infinite wait
    if product == "all":
        values = sorted(w for v in per.values() for w in v)
        return metrics.percentile(values, q)
    if product == "each":
        return max(metrics.percentile(sorted(v), q) for v in per.values())
    if product not in per:
        raise UsageError(f"no jobs of product {product!r}; this workload has {', '.join(sorted(per))}")
    return metrics.percentile(sorted(per[product]), q)

