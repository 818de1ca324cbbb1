"""``gpuslice simulate --from-cluster`` and ``gpuslice plan --from-cluster``: what-ifs on the live cluster.

``--from-cluster`` names a running extender (its URL: ``GET /state`` and ``GET /history``) or a saved
``/state`` (``gpuslice status --json``) with ``--history FILE`` (``gpuslice history export``). The
run starts from the cluster as it is (``simulations/from_cluster.py``) and replays or resamples the
recorded demand, with the what-ifs: ``--add-cards N[:MODEL]``, ``--remove-node``, ``--demand-scale``,
``--policy``, ``--admission``, ``--entitlements FILE``. ``plan --from-cluster --target
v100-100:p99=1h`` searches, seed by seed, the fewest cards to add so that every target holds, and
answers with their mean over the seeds and its 95 % interval.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packing.mix_estimator import catalog_prior
from packing.products import Catalog, load_catalog
from packing.usage import Applies
from simulations import metrics, protocol_b, report
from simulations.cluster_fetch import Connection, FetchError, state_and_history
from simulations.engine import NEVER, EngineConfig, Simulation, simulate
from simulations.from_cluster import (
    RUNNING_ENDS,
    Notes,
    Snapshot,
    SnapshotError,
    WhatIf,
    build_run,
    entitlements_from,
    load,
)
from simulations.options import (
    AdmissionChoice,
    UsageError,
    chosen_admissions,
    chosen_policies,
    chosen_ties,
    output_paths,
    parse_duration,
)
from simulations.progress import Progress
from simulations.scheduler import SchedulerModel
from simulations.sizing import smallest_cards
from simulations.traces import read_jobs

ERRORS = (SnapshotError, FetchError)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


@dataclass(frozen=True)
class AddCards:
    count: int
    model: str | None = None


def parse_add_cards(text: str) -> AddCards:
    """``N`` or ``N:MODEL`` (a card label the catalog knows, e.g. Tesla-V100-SXM2-32GB)."""
    count, _, model = text.partition(":")
    if not count.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected N or N:MODEL (cards to add, e.g. 8 or 8:Tesla-V100-SXM2-32GB), "
                                         f"got {text!r}")
    return AddCards(int(count), model.strip() or None)


def cluster_options(ap: argparse.ArgumentParser, plan: bool = False) -> None:
    """The ``--from-cluster`` group (``plan`` adds the cards itself: no ``--add-cards``)."""
    g = ap.add_argument_group("the live cluster (--from-cluster)")
    g.add_argument("--from-cluster", metavar="URL|STATE.json",
                   help="start from a running extender (its URL: GET /state and /history) or a saved /state "
                        "(gpuslice status --json) with --history FILE")
    g.add_argument("--history", metavar="FILE",
                   help="the demand history (gpuslice history export); with a URL it replaces the fetched one")
    g.add_argument("--since", default="30d", help="with a URL: how much history to fetch (default 30d)")
    for flag, what in (("--ca", "https: verify the extender against this CA"),
                       ("--cert", "https: present this client certificate"), ("--key", "https: its key"),
                       ("--server-name", "https: the name the extender's certificate carries")):
        g.add_argument(flag, default="", help=what)
    if not plan:
        g.add_argument("--add-cards", type=parse_add_cards, metavar="N[:MODEL]",
                       help="what if N cards were added (nodes of the cluster's usual size; default model: its "
                            "commonest card)")
    g.add_argument("--remove-node", action="append", default=[], metavar="NAME",
                   help="what if this node were gone (its claims go back in line); repeatable, or comma-separated")
    g.add_argument("--demand-scale", type=_positive, default=1.0, metavar="X",
                   help="what if demand were X times the recorded (default 1)")
    g.add_argument("--entitlements", metavar="FILE",
                   help="namespace entitlements: the ConfigMap gpuslice-entitlements as JSON (kubectl get cm -o "
                        "json), or 'namespace: v100-25=8,...' lines (the extender's /state does not carry them)")
    g.add_argument("--running-ends", choices=RUNNING_ENDS, default="sampled",
                   help="how long a claim runs: drawn from the recorded runtimes (sampled, default), or its declared "
                        "limit where it declared one (declared)")
    g.add_argument("--horizon", type=parse_duration, metavar="DUR",
                   help="resampled arrivals run this long after the snapshot (default: the recorded span)")


# options of the other inputs that --from-cluster does not take: (flag, why)
_NOT_WITH = (("--nodes", "the nodes are the cluster's"), ("--pods", "the demand is the history"),
             ("--cards", "the cards are the cluster's (what-if: --add-cards)"),
             ("--rho", "the load is the recorded demand (what-if: --demand-scale)"),
             ("--jobs", "the demand is the history (its length: --horizon)"),
             ("--runtime-cap", "runtimes are the recorded ones"), ("--runtimes-from", "runtimes are the recorded ones"),
             ("--never-ran", "an openb option"), ("--max-job-cards", "an openb option"),
             ("--protocol", "a live cluster runs protocol B"), ("--inflation", "protocol A's"),
             ("--offline", "protocol A's"), ("--compare-admission", "not offered here: run --admission A,B"),
             ("--saturation", "not offered here"), ("--compare", "not offered here"),
             ("--host", "the extender places by GPU only"), ("--ref-cards", "plan's own sizing"),
             ("--processes", "protocol A's"), ("--workers", "protocol A's"), ("--scheduler", "protocol A's"))
_ONLY_WITH = ("--history", "--add-cards", "--entitlements", "--horizon", "--ca", "--cert", "--key", "--server-name",
              "--remove-node", "--demand-scale", "--running-ends", "--since")
# the rule of packing/usage.py for these options (simulate and plan check them first, before their own)
RULES: tuple[Applies, ...] = (
    *(Applies((flag,), lambda a: not a.from_cluster, f"does not go with --from-cluster: {why}", "drop it")
      for flag, why in _NOT_WITH),
    Applies(_ONLY_WITH, lambda a: bool(a.from_cluster), "goes with --from-cluster",
            "drop it, or add --from-cluster URL|STATE.json"),
)


def refuse_inapplicable(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """UsageError for a combination of values that does not apply (the options themselves: ``RULES``)."""
    if args.from_cluster and args.arrivals == "trace" and args.trace:
        raise UsageError("--arrivals trace replays the recorded demand; --trace gives another: choose one")


def _snapshot(args: argparse.Namespace, catalog: Catalog) -> Snapshot:
    source = args.from_cluster
    if re.match(r"^https?://", source):
        c = Connection(source, args.ca, args.cert, args.key, args.server_name)
        return load(source, args.history, catalog, fetch=lambda: state_and_history(c, args.since))
    for dest in ("ca", "cert", "key", "server_name"):
        if getattr(args, dest):
            raise UsageError(f"--{dest.replace('_', '-')} goes with an https:// URL in --from-cluster")
    return load(source, args.history, catalog)


def _whatif(args: argparse.Namespace, add: AddCards | None) -> WhatIf:
    future = None
    if args.trace:
        jobs, report_ = read_jobs(args.trace, args.bad_rows == "error")
        if report_.skipped:
            print(f"skipped {report_.skipped} bad row(s) of {args.trace}; first: {report_.reasons[0]}")
        future = tuple(jobs)
    removed = tuple(n.strip() for spec in args.remove_node for n in spec.split(",") if n.strip())
    return WhatIf(add_cards=add.count if add else 0, add_model=add.model if add else None, remove_nodes=removed,
                  demand_scale=args.demand_scale, arrivals=args.arrivals, running_ends=args.running_ends,
                  horizon_s=args.horizon, future=future)


def _engine(args: argparse.Namespace, policy: str, admission: AdmissionChoice, catalog: Catalog) -> EngineConfig:
    ties = chosen_ties(args)
    if len(ties) > 1:
        raise UsageError(f"--from-cluster takes one tie rule, got {args.ties}")
    entitlements: tuple[tuple[str, Any], ...] = ()
    if args.entitlements:
        try:
            text = Path(args.entitlements).read_text(encoding="utf-8")
        except OSError as e:
            raise SnapshotError(f"{args.entitlements}: cannot read: {e.strerror}") from None
        entitlements = entitlements_from(text, args.entitlements, catalog)
    return admission.configure(EngineConfig(
        policy=policy, model=SchedulerModel(ties[0], args.scores), reservation_ttl_s=args.reservation_ttl,
        bind_delay_s=args.bind_delay, declare_limits=args.declare_limits,
        record_placements=bool(getattr(args, "placements", None)), entitlements=entitlements,
        prior=catalog_prior(catalog),  # the extender's cold start
        gang=bool(getattr(args, "gang", False))), args.age_limit)


def run_seeds(snap: Snapshot, whatif: WhatIf, catalog: Catalog, config: EngineConfig, seeds: Sequence[int],
              progress: Callable[[int, int], None] | None = None) -> tuple[list[Simulation], Notes]:
    """One run per seed from the live cluster; the simulations and the first seed's notes."""
    sims: list[Simulation] = []
    first: Notes | None = None
    for k, seed in enumerate(seeds):
        ledger, jobs, requests, start, notes = build_run(snap, whatif, catalog, seed)
        first = first or notes

        def step(done: int, total: int, k: int = k) -> None:
            if progress is not None:
                progress(k * total + done, total * len(seeds))

        sims.append(simulate(ledger, jobs, requests, config, seed, step, initial=start))
    assert first is not None
    return sims, first


def describe(snap: Snapshot, whatif: WhatIf) -> str:
    h = snap.header
    start, end = snap.window
    recorded = snap.recorded_seconds()
    how = "the trace given" if whatif.future is not None else (
        "replayed" if whatif.arrivals == "trace" else "resampled (Poisson)")
    scale = f" x{whatif.demand_scale:g}" if whatif.demand_scale != 1 else ""
    return (f"from cluster {snap.source}: {len(snap.nodes)} nodes, {snap.cards()} cards, {len(snap.held)} slices held, "
            f"{len(snap.line)} waiting; demand {how}{scale} from {h.claims} recorded claims over "
            f"{recorded / 3600:.1f} h recorded ({(end - start) / 3600:.1f} h window)")


def simulate_from_cluster(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``gpuslice simulate --from-cluster``: every (policy, admission) from the live cluster, per seed."""
    refuse_inapplicable(ap, args)
    catalog = load_catalog(args.catalog)
    snap = _snapshot(args, catalog)
    whatif = _whatif(args, args.add_cards)
    seeds = args.seeds or protocol_b.DEFAULT_SEEDS
    results: dict[tuple[str, str], dict[str, Any]] = {}
    sims_by: dict[str, list[Simulation]] = {}
    notes: Notes | None = None
    combos = [(p, a) for p in chosen_policies(args) for a in chosen_admissions(args)]
    bar = Progress("from cluster", True if args.progress else None)
    for k, (policy, admission) in enumerate(combos):
        config = _engine(args, policy, admission, catalog)
        def step(done: int, total: int, k: int = k) -> None:
            bar.update(k * total + done, total * len(combos))

        sims, notes = run_seeds(snap, whatif, catalog, config, seeds, step)
        result = protocol_b.ProtocolBResult(protocol_b.ProtocolBConfig(engine=config, sla_s=args.sla), sims)
        results[(policy, admission.label)] = {**result.pooled(), "per_seed_p99":
                                              {p: v.as_dict() for p, v in result.per_seed(99).items()}}
        sims_by[f"{policy}+{admission.label}"] = sims
    bar.close()
    assert notes is not None
    first = next(iter(results.values()))
    description = describe(snap, whatif)
    header = {"workload": description, "cards": first["cards"], "offered_load": first["offered_load"],
              "rounding": "slices", "ties": args.ties, "scores": args.scores, "seeds": report.seed_text(seeds),
              "runs": len(seeds)}
    print(report.protocol_b_text(results, header))
    for line in notes.lines(snap):
        print(f"note: {line}")
    if snap.policy and snap.policy not in chosen_policies(args):
        print(f"note: the extender places by {snap.policy}; this run by {', '.join(chosen_policies(args))}")
    if args.placements:
        report.write_csv(args.placements, [
            {"policy": key.partition("+")[0], "admission": key.partition("+")[2], "seed": seed, "job": job,
             "node": node, "gpus": "|".join(gpus), "start_s": round(at - snap.t0, 6)}
            for key, runs in sims_by.items() for seed, sim in zip(seeds, runs, strict=True)
            for job, node, gpus, at in sim.placements])
    data = {"protocol": "b", "from_cluster": snap.source, "workload": description, "cards": first["cards"],
            "t0": snap.t0, "seeds": list(seeds), "notes": notes.lines(snap),
            "runs": [{"policy": p, "admission": a, **r} for (p, a), r in results.items()]}
    json_path, csv_path, plots_dir = output_paths(args)
    if json_path:
        report.write_json(json_path, data)
    if csv_path:
        report.write_csv(csv_path, report.protocol_b_rows(results))
    if plots_dir:
        from simulations import plots

        d = Path(plots_dir)
        plots.wait_cdf(sims_by, d / "wait_cdf.png", f"waits per product: {snap.source}")
        window = sims_by[next(iter(sims_by))][0].window
        plots.utilisation({k: r["utilisation_over_time_pct"] for k, r in zip(sims_by, results.values(), strict=True)},
                          window[1] - window[0], d / "utilisation.png", f"utilisation from now: {snap.source}")
        plots.fragmentation(dict(zip(sims_by, results.values(), strict=True)), d / "fragmentation.png",
                            f"fragmentation: {snap.source}")
    return 0


# ---- plan ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """``PRODUCT:pQ=DUR``: the Q-th percentile wait of PRODUCT's claims (``all``: every claim) at most DUR."""

    product: str
    percentile: float
    wait_s: float

    @property
    def text(self) -> str:
        return f"{self.product} p{self.percentile:g} <= {self.wait_s / 60:g} min"


def parse_targets(text: str) -> list[Target]:
    """``v100-100:p99=1h,v100-25:p95=10m``; argparse.ArgumentTypeError naming the bad part."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"([^:=\s]+):p(\d+(?:\.\d+)?)=(.+)", part)
        if not m or not 0 < float(m.group(2)) <= 100:
            raise argparse.ArgumentTypeError(f"a target looks like v100-100:p99=1h (product or 'all', a percentile in "
                                             f"(0, 100], a wait with its unit), got {part!r}")
        out.append(Target(m.group(1), float(m.group(2)), parse_duration(m.group(3))))
    if not out:
        raise argparse.ArgumentTypeError("no target given")
    return out


def target_wait(sims: Sequence[Simulation], target: Target) -> float:
    """The target's percentile wait over one seed's claims (never started: infinite)."""
    waits: list[float] = []
    for sim in sims:
        for cls, a, s in zip(sim.job_class, sim.arrival, sim.start, strict=True):
            if target.product in ("all", sim.classes[cls]):
                waits.append(s - a if s != NEVER else math.inf)
    if not waits:
        return 0.0  # no such claim: nothing waits
    return metrics.percentile(sorted(waits), target.percentile)


def plan_from_cluster(ap: argparse.ArgumentParser, args: argparse.Namespace, targets: list[Target]) -> int:
    """``gpuslice plan --from-cluster --target v100-100:p99=1h``: per seed the fewest cards to add."""
    refuse_inapplicable(ap, args)
    catalog = load_catalog(args.catalog)
    snap = _snapshot(args, catalog)
    products = {p.name for p in catalog.products}
    bad = sorted({t.product for t in targets} - products - {"all"})
    if bad:
        raise UsageError(f"--target names {', '.join(bad)}; the catalog offers {', '.join(sorted(products))} (or all)")
    (policy,) = _single(chosen_policies(args), "policy")
    (admission,) = _single(chosen_admissions(args), "admission policy")
    config = _engine(args, policy, admission, catalog)
    base = _whatif(args, None)
    seeds = args.seeds or tuple(range(1, 11))
    now = snap.cards() - sum(len(n.cards) for n in snap.nodes if n.name in base.remove_nodes)
    answers: list[int | None] = []
    curves: list[list[tuple[int, float]]] = []
    for seed in seeds:
        def worst(cards: int, seed: int = seed) -> float:
            whatif = replace(base, add_cards=cards - now)
            sims, _ = run_seeds(snap, whatif, catalog, config, [seed])
            return max(target_wait(sims, t) / t.wait_s if t.wait_s > 0 else
                       (0.0 if target_wait(sims, t) == 0 else math.inf) for t in targets)

        bar = Progress(f"plan: seed {seed}", True if args.progress else None)
        def point(n: int, k: int, most: int | None, bar: Progress = bar) -> None:
            bar.update(k, most or k + 1)

        sizing = smallest_cards(worst, 1.0, max(1, now), now + args.max_cards, on_point=point)
        bar.close()
        answers.append(None if sizing.cards is None else sizing.cards - now)
        curves.append(sizing.curve())
    print(f"plan: {describe(snap, base)}; {policy} + {admission.label}, ties {args.ties}; "
          f"targets {', '.join(t.text for t in targets)}")
    print(f"  {'seed':>6} {'cards to add':>13}")
    for seed, a in zip(seeds, answers, strict=True):
        print(f"  {seed:>6} {a if a is not None else f'> {args.max_cards}':>13}")
    found = [a for a in answers if a is not None]
    data: dict[str, Any] = {"from_cluster": snap.source, "policy": policy, "admission": admission.label,
                            "targets": [t.__dict__ for t in targets], "cards_now": now, "seeds": list(seeds),
                            "per_seed_cards_to_add": answers}
    if len(found) < len(answers):
        print(f"answer: no card count up to --max-cards {args.max_cards} more meets it in "
              f"{len(answers) - len(found)} of {len(answers)} seeds: raise --max-cards")
        status = 1
    else:
        spread = protocol_b.SeedSpread(tuple(float(a) for a in found))
        mean, hw = spread.mean, spread.half_width
        add = math.ceil(mean - 1e-9)
        interval = f"95 % CI [{max(0.0, mean - hw):.1f}, {mean + hw:.1f}]" if math.isfinite(hw) else "one seed"
        print(f"answer: add {add} card(s) ({now} -> {now + add}); the seeds' answers average {mean:.1f}, {interval}, "
              f"max {max(found)}")
        data.update(cards_to_add=add, mean=mean, ci95_half_width=hw, sd=statistics.pstdev(found))
        status = 0
    for line in base_notes(snap, base, catalog, config):
        print(f"note: {line}")
    if args.json:
        data["curves"] = [[{"cards": n, "worst_target_ratio": w} for n, w in c] for c in curves]
        report.write_json(args.json, data)
    return status


def base_notes(snap: Snapshot, whatif: WhatIf, catalog: Catalog, config: EngineConfig) -> list[str]:
    _, _, _, _, notes = build_run(snap, whatif, catalog, 0)
    return notes.lines(snap)


def _single(items: list[Any], what: str) -> list[Any]:
    if len(items) != 1:
        raise UsageError(f"plan sizes for one {what} at a time")
    return items
