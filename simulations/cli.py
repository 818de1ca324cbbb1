"""``gpuslice simulate`` and ``gpuslice plan``: the simulator's command line (contract in README.md).

Without input files both run on the built-in synthetic workload. ``--nodes NODES.csv --pods
PODS.csv`` reads Alibaba ``openb`` files; ``--trace JOBS.csv|.jsonl`` reads our own format.
Exit status: 0 done, 2 bad usage, bad input (the message names the file and line) or an
output that cannot be written.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from packing.argtypes import positive_int
from packing.mix_estimator import catalog_prior
from packing.products import Catalog, CatalogError, Request, load_catalog
from packing.usage import CommandParser
from simulations import command_a, command_cluster, fairness, metrics, protocol_a, protocol_b, report
from simulations.cluster import CardModel, ClusterError, card_model, card_nodes, check_models
from simulations.engine import EngineConfig, EngineError
from simulations.inputs import Inputs, job_pool, load_inputs
from simulations.options import (
    PLAN_RULES,
    PLOTS_EXTRA,
    SIMULATE_RULES,
    AdmissionChoice,
    UsageError,
    check_admission_products,
    check_plots,
    chosen_admissions,
    chosen_policies,
    chosen_ties,
    dash_values,
    output_options,
    output_paths,
    parse_cap,
    parse_duration,
    parse_inflation,
    parse_load,
    parse_percentile,
    parse_rho,
    parse_seeds,
    parse_target,
    plots_missing,
    protocol_a_options,
    queue_options,
    scheduler_options,
    settle_loads,
    workload_options,
)
from simulations.outputs import OutputError, check_outputs
from simulations.progress import Progress
from simulations.scheduler import SchedulerError, SchedulerModel
from simulations.sizing import SizingError, lower_bound_cards, smallest_cards
from simulations.synthetic import SyntheticError
from simulations.traces import NodeSpec, TraceError
from simulations.workload import WorkloadError, job_request, size_class

__all__ = ["UsageError", "parse_cap", "parse_duration", "parse_rho", "parse_seeds", "plan_main", "simulate_main"]

T = TypeVar("T")
Runs = dict[tuple[str, str], dict[str, Any]]  # (policy, admission label) -> a run's figures
Saturated = dict[tuple[str, str], dict[str, float]]  # (policy, admission label) -> its usable capacity
PLAN_JOBS = 5000  # per seed and card count: the search runs the workload a dozen times
LOAD_TOLERANCE = 0.10  # an offered load further than this (relative) from --rho missed what was asked
_ERRORS = (TraceError, CatalogError, ClusterError, EngineError, SchedulerError, SyntheticError, WorkloadError,
           SizingError, protocol_b.ProtocolBError, OutputError, ValueError, OSError)


def _catalog(args: argparse.Namespace) -> Catalog:
    return load_catalog(args.catalog)


def _model(args: argparse.Namespace) -> SchedulerModel:
    ties = chosen_ties(args)
    if len(ties) > 1:
        raise UsageError(f"protocol B and plan take one tie rule, got {args.ties}")
    return SchedulerModel(ties=ties[0], scores=args.scores)


# ---- simulate --------------------------------------------------------------------------------------


def simulate_main(argv: Sequence[str]) -> int:
    """``gpuslice simulate``: protocol A or B on a trace or the built-in workload."""
    ap = CommandParser(
        prog="gpuslice simulate",
        description="Replay a workload through the packing ledger, policies and queue the extender uses. "
                    "Protocol A: FGD's benchmark (no departures, inflated to 130 %). Protocol B: departures and "
                    "the queue, waits per product. Without --pods/--trace: the built-in synthetic workload.",
        epilog="Exit status: 0 done, 2 bad usage, bad input (the message names the file and line) or an output "
               "that cannot be written (checked before the run).")
    ap.add_argument("--protocol", choices=("a", "b"),
                    help="a: FGD-compatible (no departures, 130 %% inflation); b: departures and the queue. "
                         "Default: a with --pods, b otherwise")
    ap.add_argument("--compare", action="store_true",
                    help="every placement policy (and in B every admission policy) side by side")
    ap.add_argument("--compare-admission", action="store_true",
                    help="protocol B: the admission strategies (every one, or those of --admission) side by side: "
                         "p99 wait per product pooled and as the mean of per-seed p99 with its 95 %% interval, "
                         "utilisation, and with --saturation the usable capacity; with --plots the frontier plot")
    ap.add_argument("--saturation", type=parse_load, metavar="RHO",
                    help="with --compare-admission: also run every strategy at this offered load (e.g. 1.1) and "
                         "report its utilisation as the usable capacity")
    ap.add_argument("--inflation", type=parse_inflation, default=protocol_a.DEFAULT_INFLATION,
                    help="protocol A: workload inflated to this multiple of GPU capacity, at least 1 (default 1.3)")
    ap.add_argument("--allow-missed-load", action="store_true",
                    help="protocol B: exit 0 even when the offered load reached is more than 10 %% off --rho (a "
                         "small trace resampled into few jobs); the report's first line says so either way")
    workload_options(ap)
    scheduler_options(ap)
    protocol_a_options(ap)
    queue_options(ap)
    output_options(ap)
    command_cluster.cluster_options(ap)
    args = ap.parse_args(dash_values(argv))
    if ap.check(args, (*command_cluster.RULES, *SIMULATE_RULES)):  # --from-cluster's words first
        return 2
    settle_loads(args)

    def run() -> int:
        if args.from_cluster:
            return command_cluster.simulate_from_cluster(ap, args)
        command_cluster.refuse_inapplicable(ap, args)
        inputs = load_inputs(args)
        check_plots(args.plots, "--plots")
        if args.out and not args.plots and plots_missing():
            print(f"simulate: no plots in {args.out} (matplotlib is not installed: {PLOTS_EXTRA})", file=sys.stderr)
        json_path, csv_path, plots_dir = output_paths(args)
        given = {"json": args.json, "csv": args.csv, "plots": args.plots}
        named = {key: f"--{key}" if value else "--out" for key, value in given.items()}  # the flag each came from
        check_outputs([(json_path, f"the results ({named['json']})"),
                       (csv_path, f"the results table ({named['csv']})"),
                       (args.placements, "the placements (--placements)")],
                      [(plots_dir, f"the plots ({named['plots']})")])
        protocol = args.protocol or ("a" if inputs.kind == "openb" else "b")
        if protocol == "a":
            return command_a.simulate_a(args, inputs)
        if args.workers is not None or args.scheduler:
            raise UsageError("--workers and --scheduler spread protocol A's sweeps; protocol B runs here")
        return _simulate_b(args, inputs)

    return _guarded(ap, args, run)


def _guarded(ap: CommandParser, args: argparse.Namespace, run: Callable[[], int]) -> int:
    """``run()``'s exit status, or 2 with the one-line message on stderr (and the hint to --help for bad usage)."""
    try:
        return run()
    except BrokenPipeError:
        raise  # the reader left (`| head`): the entry point ends quietly
    except UsageError as e:
        return ap.usage_error(ap.flagged(str(e), args))
    except _ERRORS as e:  # an input or an output: the message names the file, and the flag that named it
        print(f"{ap.prog}: error: {ap.flagged(str(e), args)}", file=sys.stderr)
        return 2


def _config_b(args: argparse.Namespace, inputs: Inputs, policy: str, admission: AdmissionChoice,
              rounding: str) -> protocol_b.ProtocolBConfig:
    """Protocol B's settings from the flags; the built-in workload is generated at --rho, so not rescaled."""
    engine = admission.configure(EngineConfig(
        policy=policy, model=_model(args), reservation_ttl_s=args.reservation_ttl, bind_delay_s=args.bind_delay,
        declare_limits=args.declare_limits, prior=_prior(inputs, _catalog(args), rounding),
        record_placements=bool(getattr(args, "placements", None)), gang=args.gang), args.age_limit)
    return protocol_b.ProtocolBConfig(engine=engine, rounding=rounding,
                                      rho=None if inputs.kind == "builtin" else args.rho, arrivals=args.arrivals,
                                      jobs=args.jobs, sla_s=args.sla)


def _prior(inputs: Inputs, catalog: Catalog, rounding: str) -> tuple[Request, ...]:
    """What a mix estimator starts from: the catalog's products when the jobs are catalog slices (as in
    the extender), nothing for free-form sizes the catalog does not describe."""
    sliced = rounding == "slices" or inputs.kind == "builtin" or any(j.product for j in inputs.jobs or ())
    return catalog_prior(catalog) if sliced else ()


def _simulate_b(args: argparse.Namespace, inputs: Inputs) -> int:
    """Protocol B on every pod list of ``--pods`` at every load of ``--rho``: one block each, and with
    ``--compare-admission`` over several of them, the fairness summary across all."""
    workloads = inputs.workloads or [(inputs.description, inputs.pods or [])]
    several = len(workloads) * len(args.rhos) > 1  # --placements is refused then (SIMULATE_RULES)
    catalog = _catalog(args)
    blocks: list[tuple[str, str, Runs, Saturated]] = []
    sweep: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    missed = False
    for name, pods in workloads:
        args.saturated = None  # measured once per workload (at the first load), reused at the others
        for rho in args.rhos:
            one = replace(inputs, description=name, pods=pods if inputs.pods is not None else None)
            args.rho = rho
            if several:
                print(f"\n==== {name}, ρ {_rho_text(args, one)} ====")
            sub = _sub_out(args, name, rho) if several else None
            data, results, saturated, off = _simulate_b_one(args, one, catalog, sub)
            missed = missed or off
            blocks.append((_short(name), _rho_text(args, one), results, saturated))
            sweep.append(data)
            rows.extend({**({"workload": name, "rho": rho} if several else {}), **r}
                        for r in report.protocol_b_rows(results))
    if several and args.compare_admission:
        print()
        print(report.fairness_summary_text(blocks, catalog))
    _print_skipped(inputs)
    _write_results(args, sweep[0] if not several else {"protocol": "b", "sweep": sweep}, lambda: rows)
    return 1 if missed and not args.allow_missed_load else 0


def _short(workload: str) -> str:
    """A pod list's name as the summary shows it: ``openb_pod_list_default.csv`` -> ``default``."""
    return workload.removeprefix("openb_pod_list_").removesuffix(".csv")


def _sub_out(args: argparse.Namespace, workload: str, rho: float | None) -> Path | None:
    """Where one (workload, load) of several puts its plots: a folder per pair under the plots folder."""
    _, _, plots_dir = output_paths(args)
    if not plots_dir:
        return None
    short = _short(workload).replace("/", "_").replace(" ", "_")
    return Path(plots_dir) / f"{short}-rho{'trace' if rho is None else rho}"


def _simulate_b_one(args: argparse.Namespace, inputs: Inputs, catalog: Catalog,
                    plots_dir: Path | None) -> tuple[dict[str, Any], Runs, Saturated, bool]:
    """One workload at one load (``args.rho``): every (policy, admission) run, printed; returns the JSON
    data, the per-run figures, the saturation runs and whether the offered load missed the one asked."""
    rounding = args.rounding or "slices"
    seeds = args.seeds or protocol_b.DEFAULT_SEEDS
    source, cap, description = job_pool(args, inputs)
    nodes = inputs.nodes if inputs.nodes is not None and not args.cards else None
    cards = None if nodes is not None else (args.cards or protocol_b.DEFAULT_CARDS)
    card, host_ignored = _cards_b(args, source, catalog, rounding, nodes, cards)
    policies = chosen_policies(args)
    admissions = chosen_admissions(args)
    check_admission_products(admissions, catalog)
    if args.compare_admission and not any(a.label == fairness.REFERENCE for a in admissions):
        # the reference the fairness goal is judged against
        admissions = [AdmissionChoice(fairness.REFERENCE, fairness.REFERENCE), *admissions]
    combos = [(p, a) for p in policies for a in admissions]
    results: Runs = {}
    sims: dict[str, list[Any]] = {}
    done: dict[tuple[str, str], protocol_b.ProtocolBResult] = {}
    bar = _progress(args, "protocol B")
    for k, (policy, admission) in enumerate(combos):
        config = _config_b(args, inputs, policy, admission, rounding)
        result = protocol_b.run(source, catalog, config, seeds, nodes=nodes, cards=cards, card=card,
                                track_host=args.host, progress=_stepper(bar, k, len(combos)))
        results[(policy, admission.label)] = {**result.pooled(), "per_seed_p99":
                                              {p: v.as_dict() for p, v in result.per_seed(99).items()},
                                              "per_seed_max_wait_s": [metrics.waits_max(x) for x in result.simulations]}
        results[(policy, admission.label)]["mean_wait_by_arrival_fifth_s"] = \
            metrics.mean_wait_by_arrival(result.simulations)
        done[(policy, admission.label)] = result
        sims[f"{policy}+{admission.label}"] = result.simulations
    bar.close()
    saturated = getattr(args, "saturated", None)
    if saturated is None:
        saturated = args.saturated = _saturation_runs(args, inputs, catalog, combos, rounding, seeds, nodes, cards,
                                                      card)
    first = next(iter(results.values()))
    some = next(iter(done.values()))
    runtime_cap = cap.as_dict() if cap else None
    if runtime_cap is not None:
        runtime_cap = {**runtime_cap, "simulated_jobs": some.simulated_jobs(),
                       "simulated_at_cap": some.capped_jobs(cap.cap_s if cap else None)}
    header = {"workload": description, "cards": first["cards"], "offered_load": first["offered_load"],
              "rounding": rounding, "ties": args.ties, "scores": args.scores, "seeds": _seed_text(seeds),
              "runs": len(seeds), "runtime_cap": runtime_cap}
    missed = _missed_load(args.rho, first["offered_load"], first["waits"]["all"]["jobs"] // max(1, len(seeds)))
    if missed:
        print(missed + ("" if args.allow_missed_load else "; exit status 1 (--allow-missed-load accepts it)"))
    print(report.protocol_b_text(results, header))
    if host_ignored:
        print(f"host CPU/RAM asked by {host_ignored} job(s) not tracked: protocol B places by GPU only unless --host")
    if args.compare_admission:
        print()
        print(report.admission_table_text(results, saturated, header, catalog))
    data = {
        "protocol": "b",
        "workload": description,
        "cards": first["cards"],
        "rounding": rounding,
        "ties": args.ties,
        "scores": args.scores,
        "seeds": list(seeds),
        "rho_target": None if inputs.kind == "builtin" else args.rho,
        "arrivals": args.arrivals,
        "runtime_cap": runtime_cap or {"runtime_cap_s": args.runtime_cap},
        "host_tracked": args.host,
        "runs": [{"policy": p, "admission": a, **r,
                  **({"saturation": saturated[(p, a)]} if (p, a) in saturated else {})}
                 for (p, a), r in results.items()],
        "skipped_rows": inputs.skipped(),
    }
    if args.placements:
        report.write_csv(args.placements, [
            {"policy": key.partition("+")[0], "admission": key.partition("+")[2], "seed": seed, "job": job,
             "node": node, "gpus": "|".join(gpus), "start_s": at}
            for key, runs in sims.items() for seed, sim in zip(seeds, runs, strict=True)
            for job, node, gpus, at in sim.placements])
    if plots_dir is None:
        _, _, plots = output_paths(args)
        plots_dir = Path(plots) if plots else None
    if plots_dir is not None:
        _plots_b(args, inputs, seeds, description, results, sims, plots_dir)
    return data, results, saturated, bool(missed)


def _plots_b(args: argparse.Namespace, inputs: Inputs, seeds: Sequence[int], description: str,
             results: Runs, sims: dict[str, list[Any]], d: Path) -> None:
    from simulations import plots

    plots.wait_cdf(sims, d / "wait_cdf.png", f"waits per product: {description}")
    window = sims[next(iter(sims))][0].window
    plots.utilisation({k: r["utilisation_over_time_pct"] for k, r in
                       zip(sims, results.values(), strict=True)}, window[1] - window[0],
                      d / "utilisation.png", f"utilisation over time: {description}")
    plots.fragmentation(dict(zip(sims, results.values(), strict=True)), d / "fragmentation.png",
                        f"fragmentation: {description}")
    if args.compare_admission:
        points = report.frontier_points(results)
        if points:
            plots.frontier(points, d / "frontier.png",
                           f"quarter against whole-card p99 wait: {description}, ρ {_rho_text(args, inputs)}, "
                           f"seeds {_seed_text(seeds)}")


def _missed_load(asked: float | None, reached: float, jobs: int) -> str:
    """The report's first line when the offered load reached is not the one asked (empty when it is)."""
    if asked is None or (math.isfinite(reached) and abs(reached - asked) <= LOAD_TOLERANCE * asked):
        return ""
    return (f"offered load missed: ρ {reached:.2f} reached, not the {asked:g} asked (--rho): {jobs} job(s) per run "
            "arrive over too short a window to offer a steady load; resample more of them with --jobs N")


def _rho_text(args: argparse.Namespace, inputs: Inputs) -> str:
    return "as generated" if inputs.kind == "builtin" and args.rho is None else f"{args.rho}"


def _saturation_runs(args: argparse.Namespace, inputs: Inputs, catalog: Catalog,
                     combos: list[tuple[str, AdmissionChoice]], rounding: str, seeds: Sequence[int],
                     nodes: list[NodeSpec] | None, cards: int | None,
                     card: CardModel | None) -> dict[tuple[str, str], dict[str, float]]:
    """With ``--saturation RHO``: every combination again at that load; its utilisation is the usable capacity."""
    if args.saturation is None:
        return {}
    saved = args.rho
    args.rho = args.saturation
    try:
        source, _, _ = job_pool(args, inputs)  # the built-in workload is generated at --rho
        out: dict[tuple[str, str], dict[str, float]] = {}
        bar = _progress(args, f"saturation ρ {args.saturation}")
        for k, (policy, admission) in enumerate(combos):
            config = _config_b(args, inputs, policy, admission, rounding)
            if inputs.kind == "builtin":
                config = protocol_b.ProtocolBConfig(engine=config.engine, rounding=rounding, rho=None,
                                                    arrivals=args.arrivals, jobs=args.jobs, sla_s=args.sla)
            result = protocol_b.run(source, catalog, config, seeds, nodes=nodes, cards=cards, card=card,
                                    track_host=args.host, progress=_stepper(bar, k, len(combos)))
            util = protocol_b.SeedSpread(tuple(sim.mean_allocated_pct for sim in result.simulations))
            out[(policy, admission.label)] = {"rho": args.saturation, "utilisation_pct": util.mean,
                                              "utilisation_ci95_half_width": util.half_width}
        bar.close()
        return out
    finally:
        args.rho = saved


def _cards_b(args: argparse.Namespace, source: protocol_b.PoolSource, catalog: Catalog, rounding: str,
             nodes: Sequence[NodeSpec] | None, cards: int | None) -> tuple[CardModel | None, int]:
    """The cards a fixed job pool needs (checked against the cluster's models), and how many of its jobs
    ask for host CPU/RAM that goes untracked; (None, 0) for a pool generated per seed."""
    if callable(source):
        return None, 0
    requests = [job_request(j, catalog, rounding) for j in source]
    card = card_model(catalog, rounding, requests, args.card_model)
    check_models(requests, nodes if nodes is not None else card_nodes(cards or protocol_b.DEFAULT_CARDS,
                                                                        label=args.card_model), card)
    ignored = 0 if args.host else sum(1 for r in requests if r.cpu_milli or r.host_memory_mib)
    return card, ignored


def _write_results(args: argparse.Namespace, data: dict[str, Any],
                   rows: Callable[[], list[dict[str, Any]]]) -> Path | None:
    """Write ``--json`` and ``--csv`` (or into ``--out``); the folder for plots, if any were asked for."""
    json_path, csv_path, plots_dir = output_paths(args)
    if json_path:
        report.write_json(json_path, data)
    if csv_path:
        report.write_csv(csv_path, rows())
    return Path(plots_dir) if plots_dir else None


def _progress(args: argparse.Namespace, label: str) -> Progress:
    """A progress bar on stderr: forced on by ``--progress``, else only on a terminal."""
    return Progress(label, True if args.progress else None)


def _stepper(bar: Progress, k: int, parts: int) -> Callable[[int, int], None]:
    """Progress of part ``k`` of ``parts`` equal parts, as one bar."""

    def step(done: int, total: int) -> None:
        bar.update(k * total + done, total * parts)

    return step


def _seed_text(seeds: Sequence[int]) -> str:
    return report.seed_text(seeds)


def _print_skipped(inputs: Inputs) -> None:
    inputs.print_skipped()


# ---- plan ------------------------------------------------------------------------------------------


def plan_main(argv: Sequence[str]) -> int:
    """``gpuslice plan``: the smallest card count whose wait percentile meets a target."""
    ap = CommandParser(
        prog="gpuslice plan",
        description="Find the smallest number of cards whose wait percentile meets a target, by bisection "
                    "over protocol B runs of a fixed workload (built-in synthetic by default).")
    ap.add_argument("--target", type=plan_target, default=600.0, metavar="DUR|PRODUCT:pQ=DUR",
                    help="wait target with its unit: 90s, 10m, 2h or 1d (default 10m; a bare number is refused), or "
                         "PRODUCT:pQ=DUR[,...] (e.g. v100-100:p99=1h: the 99th percentile wait of whole cards; "
                         "'all' for every claim), which sets --percentile and --product")
    ap.add_argument("--percentile", type=parse_percentile, default=95.0, help="wait percentile to hold (default 95)")
    ap.add_argument("--product", default="all",
                    help="product the target applies to: a product name, 'all' jobs (default) or 'each' product")
    ap.add_argument("--max-cards", type=positive_int, default=4096, help="give up above this many (default 4096)")
    ap.add_argument("--ref-cards", type=positive_int, default=protocol_b.DEFAULT_CARDS,
                    help="the workload offers --rho to this many cards (default 64)")
    workload_options(ap)
    scheduler_options(ap)
    queue_options(ap)
    ap.add_argument("--json", metavar="PATH", help="write the answer and the curve as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write the curve as PNG")
    ap.add_argument("--progress", action="store_true", help="progress on stderr even when not a terminal")
    ap.add_argument("--allow-missed-target", action="store_true",
                    help="exit 0 even when no card count up to --max-cards meets the target (the first line says "
                         "so either way)")
    command_cluster.cluster_options(ap, plan=True)
    args = ap.parse_args(dash_values(argv))
    if ap.check(args, (*command_cluster.RULES, *PLAN_RULES)):
        return 2
    settle_loads(args)
    return _guarded(ap, args, lambda: _plan_any(ap, args))


def plan_target(text: str) -> float | list[command_cluster.Target]:
    """``--target``: a wait (``10m``) or ``PRODUCT:pQ=DUR[,...]``."""
    if ":" in text:
        return command_cluster.parse_targets(text)
    return parse_target(text)


def _plan_any(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    targets = args.target if isinstance(args.target, list) else \
        [command_cluster.Target(args.product, args.percentile, args.target)]
    if args.from_cluster:
        if any(t.product == "each" for t in targets):
            raise UsageError("--product each: name the products in --target (v100-25:p99=10m,v100-100:p99=1h)")
        return command_cluster.plan_from_cluster(ap, args, targets)
    command_cluster.refuse_inapplicable(ap, args)
    if isinstance(args.target, list):
        if len(targets) != 1:
            raise UsageError("plan without --from-cluster sizes for one target at a time")
        args.product, args.percentile, args.target = targets[0].product, targets[0].percentile, targets[0].wait_s
    return _plan(args)


def _plan(args: argparse.Namespace) -> int:
    inputs = load_inputs(args)  # one load and one pod list (PLAN_RULES)
    check_plots(args.plot, "--plot")
    check_outputs([(args.json, "the plan (--json)"), (args.plot, "the plot (--plot)")], [])
    catalog = _catalog(args)
    rounding = args.rounding or "slices"
    seeds = args.seeds or protocol_b.DEFAULT_SEEDS
    args.cards = args.cards or args.ref_cards
    args.jobs = args.jobs or PLAN_JOBS
    source, _, description = job_pool(args, inputs)
    (policy,), (choice,) = _one(chosen_policies(args), "policy"), _one(chosen_admissions(args), "admission policy")
    admission = choice.label
    check_admission_products([choice], catalog)
    config = _config_b(args, inputs, policy, choice, rounding)
    # the workload is fixed (shaped against --ref-cards); only the cluster changes
    workloads = [protocol_b.seed_workload(source, catalog, config, 1000 * args.ref_cards, s) for s in seeds]
    classes = sorted({size_class(r) for _, reqs, _ in workloads for r in reqs})
    if args.product not in ("all", "each", *classes):  # before the search, not after its first run
        raise UsageError(f"--product {args.product}: no job of this workload is one; it has {', '.join(classes)} "
                         "(or 'all', 'each')")
    fixed = protocol_b.ProtocolBConfig(engine=config.engine, rounding=rounding, rho=None, sla_s=args.sla)
    work = max(sum(r.total_milli * (j.duration or 0.0) for j, r in zip(jobs, reqs, strict=True))
               / max(1e-9, jobs[-1].arrival - jobs[0].arrival) for jobs, reqs, _ in workloads)
    low = lower_bound_cards(work, 1.0)
    if low > args.max_cards:
        raise UsageError(f"the offered work needs at least {low} cards, above --max-cards {args.max_cards}: "
                         "raise --max-cards, or lower --rho or --jobs")
    step = ["plan"]

    def announce(cards: int, k: int, at_most: int | None) -> None:
        step[0] = f"plan: {cards} cards, run {k}" + (f" of at most {at_most}" if at_most else " (bracketing)")

    def wait_at(cards: int) -> float:
        sims = []
        bar = _progress(args, step[0])  # one line per card count: its seeds' simulations, as they run
        for i, ((jobs, _, _), seed) in enumerate(zip(workloads, seeds, strict=True)):
            res = protocol_b.run(jobs, catalog, fixed, [seed], cards=cards, track_host=args.host,
                                 progress=_stepper(bar, i, len(seeds)))
            sims.extend(res.simulations)
        bar.close()
        return _plan_metric(sims, args.percentile, args.product)

    sizing = smallest_cards(wait_at, args.target, low, args.max_cards, start=max(args.ref_cards, low + 1),
                            on_point=announce)
    label = f"p{args.percentile:g} ({args.product})"
    if sizing.cards is None:
        print(f"plan: target missed: no card count up to --max-cards {args.max_cards} holds the {label} wait to "
              f"{args.target / 60:g} min; the curve below shows what each reached"
              + ("" if args.allow_missed_target else "; exit status 1 (--allow-missed-target accepts it)"))
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

        whose = {"all": "all jobs", "each": "the worst product"}.get(args.product, f"{args.product} jobs")
        plots.sizing_curve(sizing.curve(), args.target, sizing.cards, args.plot, f"sizing: {description}",
                           f"p{args.percentile:g} wait of {whose}")
    return 0 if sizing.cards is not None or args.allow_missed_target else 1


def _one(names: list[T], what: str) -> list[T]:
    if len(names) != 1:
        raise UsageError(f"plan sizes for one {what} at a time, got {', '.join(map(_label, names))}")
    return names


def _label(item: object) -> str:
    return item.label if isinstance(item, AdmissionChoice) else str(item)


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

