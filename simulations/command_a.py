"""``gpuslice simulate --protocol a``: protocol A over one or many workloads, policies and tie rules.

One run is (workload, tie rule, policy, seed); the offline reference adds (workload, seed). Runs
are independent and deterministic, so ``--processes N`` spreads them over N worker processes
(fork: the inputs are read once, in the parent), and ``--workers N`` / ``--scheduler ADDR`` over
Dask workers (``simulations/dask_sweep.py``); the results do not depend on either.

One workload and one tie rule print the classic table (policies against the published figures);
several print the sweep: a row per workload and tie rule, a column per policy, the offline
reference and FGD's published figure beside them.

A policy with unique keys under exact scores never leaves kube-scheduler a tie, so its runs are the
same under every tie rule: it runs once per seed, and its stable runs stand for the other rules
(``_tie_free``; a test checks that a real random-tie run gives the same).
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packing.mix_estimator import catalog_prior
from packing.policies import get_policy
from packing.products import Catalog, Request, load_catalog
from simulations import offline, protocol_a, protocol_b, report
from simulations.cluster import CardModel, card_model, card_model_for, card_nodes, check_models
from simulations.inputs import Inputs
from simulations.options import UsageError, chosen_policies, chosen_ties, output_paths
from simulations.progress import Progress
from simulations.scheduler import SchedulerModel
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import NodeSpec
from simulations.workload import job_request


@dataclass(frozen=True)
class Workload:
    """One protocol A input: its name, the cluster, the requests and the cards they need."""

    name: str
    nodes: list[NodeSpec]
    requests: list[Request]
    card: CardModel
    prior: tuple[Request, ...] = ()  # the mix estimator's start: the catalog's products for catalog slices


Task = tuple[str, int, str, str, int]  # (kind "run" | "offline", workload index, policy, ties, seed)

_WORK: list[Workload] = []  # read by the worker processes (inherited through fork)
_CONFIG: dict[str, Any] = {}


def workloads_of(args: argparse.Namespace, inputs: Inputs, catalog: Catalog, rounding: str) -> list[Workload]:
    """Every workload the command runs, each checked: models no card has, or memory no card gives, are errors."""
    out: list[Workload] = []
    if inputs.kind == "openb":
        if inputs.nodes is None:
            raise UsageError("protocol A on openb pods needs --nodes (openb_node_list_gpu_node.csv)")
        for name, pods in inputs.workloads:
            requests = protocol_a.pod_requests(pods, catalog, rounding)
            card = card_model_for(catalog, rounding, args.card_model)
            check_models(requests, inputs.nodes, card)
            out.append(Workload(name, inputs.nodes, requests, card, _prior(catalog, requests)))
        return out
    jobs = inputs.jobs if inputs.jobs is not None else generate(SyntheticSpec(cards=args.cards or 64,
                                                                              jobs=args.jobs or 2000), 0)
    nodes = inputs.nodes or card_nodes(args.cards or protocol_b.DEFAULT_CARDS, label=args.card_model)
    requests = [job_request(j, catalog, rounding) for j in jobs]
    card = card_model(catalog, rounding, requests, args.card_model)
    check_models(requests, nodes, card)
    return [Workload(inputs.description, nodes, requests, card, _prior(catalog, requests))]


def _prior(catalog: Catalog, requests: Sequence[Request]) -> tuple[Request, ...]:
    """The catalog's products when the requests are catalog slices (as the extender starts), else nothing."""
    return catalog_prior(catalog) if any(r.product for r in requests) else ()


def run_task(task: Task, work: Workload, settings: dict[str, Any]) -> protocol_a.RunA | offline.OfflineRun:
    """One run of ``task`` on its workload: the unit of work of every executor (here, processes, Dask)."""
    kind, _, policy, ties, seed = task
    if kind == "offline":
        return offline.reference(work.nodes, work.requests, work.card, seed, settings["inflation"], prior=work.prior)
    config = protocol_a.ProtocolAConfig(policy=policy, rounding=settings["rounding"],
                                        model=SchedulerModel(ties=ties, scores=settings["scores"]),
                                        inflation=settings["inflation"], prior=work.prior)
    return protocol_a.run_seed(work.nodes, work.requests, work.card, config, seed)


def _run(task: Task) -> protocol_a.RunA | offline.OfflineRun:
    return run_task(task, _WORK[task[1]], _CONFIG)


def _tie_free(policy: str, scores: str, ties_rules: Sequence[str]) -> bool:
    """Whether ``policy``'s stable run stands for every tie rule: unique keys under exact scores
    leave kube-scheduler one best node, so no tie rule is ever consulted (the runs are identical)."""
    return "stable" in ties_rules and scores == "exact" and get_policy(policy).capabilities.unique_keys


def execute(tasks: Sequence[Task], processes: int, progress: Callable[[int, int], None]) -> list[Any]:
    """Every task's result, in task order; ``processes`` > 1 runs them in worker processes."""
    if processes <= 1 or len(tasks) <= 1:
        out = []
        for i, t in enumerate(tasks):
            out.append(_run(t))
            progress(i + 1, len(tasks))
        return out
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        futures = [pool.submit(_run, t) for t in tasks]
        results = []
        for done, f in enumerate(futures, start=1):
            results.append(f.result())
            progress(done, len(tasks))
        return results


def simulate_a(args: argparse.Namespace, inputs: Inputs) -> int:
    catalog = load_catalog(args.catalog)
    rounding = args.rounding or "none"
    seeds = list(args.seeds or protocol_a.DEFAULT_SEEDS)
    ties_rules = chosen_ties(args)
    policies = chosen_policies(args)
    with_offline = bool(args.offline or args.compare)
    work = workloads_of(args, inputs, catalog, rounding)
    _WORK[:] = work
    _CONFIG.update(rounding=rounding, scores=args.scores, inflation=args.inflation)
    tasks: list[Task] = [("run", w, p, t, s) for w in range(len(work)) for t in ties_rules for p in policies
                         for s in seeds if not (t != "stable" and _tie_free(p, args.scores, ties_rules))]
    if with_offline:
        tasks += [("offline", w, "", "", s) for w in range(len(work)) for s in seeds]
    bar = Progress("protocol A", True if args.progress else None)
    if args.workers is not None or args.scheduler:
        from simulations import dask_sweep

        results = dask_sweep.run(tasks, work, dict(_CONFIG), bar.update, workers=args.workers,
                                 scheduler=args.scheduler)
    else:
        results = execute(tasks, args.processes, bar.update)
    bar.close()
    summary: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    references: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    grouped: dict[tuple[int, str, str], list[protocol_a.RunA]] = {}
    grouped_off: dict[int, list[offline.OfflineRun]] = {}
    for task, result in zip(tasks, results, strict=True):
        _, w, policy, ties, _ = task
        if isinstance(result, offline.OfflineRun):
            grouped_off.setdefault(w, []).append(result)
            runs.append({"workload": work[w].name, "policy": offline.OFFLINE, **result.as_dict()})
        else:
            grouped.setdefault((w, ties, policy), []).append(result)
            runs.append({"workload": work[w].name, **{k: v for k, v in result.as_dict().items() if k != "curve"}})
    for t in ties_rules:  # a tie-free policy's stable runs stand for the other tie rules
        for p in policies:
            if t != "stable" and _tie_free(p, args.scores, ties_rules):
                for w in range(len(work)):
                    same = [replace(r, ties=t) for r in grouped[(w, "stable", p)]]
                    grouped[(w, t, p)] = same
                    runs.extend({"workload": work[w].name, **{k: v for k, v in r.as_dict().items() if k != "curve"}}
                                for r in same)
    for (w, ties, policy), done in grouped.items():
        summary.setdefault(work[w].name, {}).setdefault(ties, {})[policy] = protocol_a.summarize(done)
    for w, refs in grouped_off.items():
        references[work[w].name] = offline.summarize(refs)
    published = {wl.name: report.published_for(wl.name, rounding, args.inflation) for wl in work}
    header = {"rounding": rounding, "scores": args.scores, "seeds": report.seed_text(seeds),
              "inflation": args.inflation}
    if len(work) == 1 and len(ties_rules) == 1:
        name = work[0].name
        print(report.protocol_a_text(summary[name][ties_rules[0]], {
            **header, "trace": name, "ties": ties_rules[0],
            "published": published[name] if ties_rules[0] == "stable" else {}}, references.get(name)))
    else:
        print(report.protocol_a_sweep_text(summary, references, published, header, policies))
    inputs.print_skipped()
    first, ties0 = work[0].name, ties_rules[0]
    main = summary[first][ties0][policies[0]]
    data = {
        "protocol": "a", "workload": first, "nodes": len(work[0].nodes), "cards": sum(n.gpus for n in work[0].nodes),
        "rounding": rounding, "ties": ties0, "scores": args.scores, "inflation": args.inflation, "seeds": seeds,
        "policy": policies[0], "unallocated_gpu_pct_at_100": main["unallocated_gpu_pct_at_100"],
        "unallocated_gpu_pct_at_100_sd": main["unallocated_gpu_pct_at_100_sd"],
        "policies": summary[first][ties0], "offline": references.get(first),
        "workloads": summary, "offline_by_workload": references, "runs": runs,
        "published_unallocated_gpu_pct_at_100": published[first], "published_by_workload": published,
        "skipped_rows": inputs.skipped(),
    }
    json_path, csv_path, plots_dir = output_paths(args)
    if json_path:
        report.write_json(json_path, data)
    if csv_path:
        report.write_csv(csv_path, report.protocol_a_rows(summary[first][ties0]))
    if plots_dir:
        from simulations import plots

        plots.allocation_vs_arrived({p: s["curve"] for p, s in summary[first][ties0].items()},
                                    Path(plots_dir) / "allocation_vs_arrived.png",
                                    f"protocol A: {first} (rounding {rounding}, ties {ties0})")
    return 0

