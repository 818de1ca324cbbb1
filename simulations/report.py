"""Reports: JSON and CSV files and the one-screen text summary (plots are in ``plots``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packing.products import Catalog
from simulations import fairness
from simulations.metrics import product_order
from simulations.protocol_a import CURVE_MAX_PCT

# Published unallocated GPU % at arrived 100 % (FGD, ATC'23: the artifact's cached results, mean of
# 10 seeds, free-form sizes, stable ties, 130 % inflation), per openb pod list
_PUBLISHED_COLUMNS = ("fgd", "go-best-fit", "gpu-packing", "gpu-clustering", "dot-product", "random")
PUBLISHED: dict[str, dict[str, float]] = {
    f"openb_pod_list_{name}.csv": dict(zip(_PUBLISHED_COLUMNS, figures, strict=True)) for name, figures in (
        ("default", (4.77, 7.14, 8.22, 8.35, 9.38, 13.70)),
        ("gpushare40", (6.04, 8.56, 10.23, 10.24, 10.70, 15.14)),
        ("gpushare60", (8.75, 10.94, 12.85, 13.10, 13.18, 17.19)),
        ("gpushare80", (10.92, 13.34, 15.35, 15.50, 15.86, 19.38)),
        ("gpushare100", (13.36, 15.38, 17.87, 17.78, 18.02, 21.10)),
        ("multigpu50", (2.91, 4.38, 3.94, 4.31, 5.27, 18.72)),
        ("cpu250", (6.80, 8.79, 11.95, 12.25, 16.43, 20.00)),
        ("gpuspec33", (12.16, 19.61, 17.78, 18.91, 20.18, 16.13)),
    )
}
PUBLISHED_DEFAULT = PUBLISHED["openb_pod_list_default.csv"]


def published_for(workload: str, rounding: str, inflation: float) -> dict[str, float]:
    """The published figures comparable with a run: free-form sizes at 130 % inflation only ({} otherwise)."""
    if rounding != "none" or inflation != 1.3:
        return {}
    return PUBLISHED.get(workload, {})


def seed_text(seeds: Sequence[int]) -> str:
    """``42-51`` for a range, ``1,3,7`` otherwise."""
    s = list(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s))


MAX_NAMESPACE_LINES = 6  # more tenants than this go to the JSON only


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: str | Path, data: Mapping[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with p.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else round(v, 6)
    return v


def _minutes(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "-"
    return f"{seconds / 60:.1f}"


# ---- protocol A ----------------------------------------------------------------------------------


def protocol_a_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One CSV row per (policy, integer arrived %): the mean allocation curve."""
    rows: list[dict[str, Any]] = []
    for policy, summary in results.items():
        curve = summary["curve"]
        for pct in range(CURVE_MAX_PCT + 1):
            rows.append({"policy": policy, "arrived_pct": pct, "allocated_pct": curve[pct]})
    return rows


def protocol_a_text(results: Mapping[str, Mapping[str, Any]], header: Mapping[str, Any],
                    reference: Mapping[str, Any] | None = None) -> str:
    """The protocol A table: unallocated GPU % at arrived 100 %, against the published and the offline reference."""
    lines = [
        f"protocol A  trace {header.get('trace', '?')}  rounding {header.get('rounding')}  "
        f"ties {header.get('ties')}  scores {header.get('scores')}  seeds {header.get('seeds')}",
        f"{'policy':<16} {'unalloc% @100':>14} {'sd':>6} {'first@100':>10} {'alloc% end':>11} "
        f"{'s/run':>7} {'published':>10}",
    ]
    published = header.get("published") or {}
    for policy, s in sorted(results.items(), key=lambda kv: kv[1]["unallocated_gpu_pct_at_100"]):
        pub = published.get(policy)
        lines.append(
            f"{policy:<16} {s['unallocated_gpu_pct_at_100']:>14.2f} {s['unallocated_gpu_pct_at_100_sd']:>6.2f} "
            f"{s['unallocated_gpu_pct_first_100']:>10.2f} {s['allocated_pct_final']:>11.2f} "
            f"{s['seconds_per_run']:>7.2f} {'' if pub is None else f'{pub:.2f}':>10}"
        )
    if reference is not None:
        lines.append(f"{'offline (ref.)':<16} {reference['unallocated_gpu_pct']:>14.2f} "
                     f"{reference['unallocated_gpu_pct_sd']:>6.2f} {'':>10} {'':>11} "
                     f"{reference['seconds_per_run']:>7.2f}")
    lines.append("unallocated GPU % = 100 − mean allocation % over arrival events with round(arrived %) = 100")
    if reference is not None:
        lines.append("offline (ref.): the pods arrived up to 100 %, packed knowing all of them "
                     "(simulations/offline.py)")
    return "\n".join(lines)


def protocol_a_sweep_text(summary: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]],
                          references: Mapping[str, Mapping[str, Any]], published: Mapping[str, Mapping[str, float]],
                          header: Mapping[str, Any], policies: Sequence[str]) -> str:
    """One row per (workload, tie rule): unallocated GPU % (mean ± sd) per policy, the offline reference,
    FGD's published figure, and the first policy against FGD (re-implemented, same ties)."""
    cols = list(policies)
    widths = [max(15, len(p)) for p in cols]  # a long policy name widens its column instead of being cut
    head = f"{'workload':<22} {'ties':<7}" + "".join(f" {p:>{w}}" for p, w in zip(cols, widths, strict=True))
    ratio_w = max(16, len(cols[0]) + 4)
    head += f" {'offline':>13} {'FGD publ.':>9}" + (f" {cols[0] + '/fgd':>{ratio_w}}" if "fgd" in cols else "")
    lines = [f"protocol A  rounding {header.get('rounding')}  scores {header.get('scores')}  seeds "
             f"{header.get('seeds')}  inflation {header.get('inflation')}: unallocated GPU % at arrived 100 % "
             "(mean ± sd over seeds)", head]
    for workload, by_ties in summary.items():
        short = workload.removeprefix("openb_pod_list_").removesuffix(".csv")
        ref = references.get(workload)
        pub = published.get(workload, {}).get("fgd")
        for ties, by_policy in by_ties.items():
            row = f"{short:<22} {ties:<7}"
            for p, w in zip(cols, widths, strict=True):
                s = by_policy.get(p)
                cell = _pm(s["unallocated_gpu_pct_at_100"], s["unallocated_gpu_pct_at_100_sd"]) if s else "-"
                row += f" {cell:>{w}}"
            row += f" {_pm(ref['unallocated_gpu_pct'], ref['unallocated_gpu_pct_sd']) if ref else '-':>13}"
            row += f" {'' if pub is None or ties != 'stable' else f'{pub:.2f}':>9}"
            if "fgd" in cols and cols[0] in by_policy:
                ours, fgd = (by_policy[cols[0]]["unallocated_gpu_pct_at_100"],
                             by_policy["fgd"]["unallocated_gpu_pct_at_100"])
                row += f" {ours / fgd if fgd else float('nan'):>{ratio_w}.2f}"
            lines.append(row)
    lines.append("unallocated GPU % = 100 − mean allocation % over arrival events with round(arrived %) = 100; "
                 "offline: the pods arrived up to 100 %, packed knowing all of them")
    return "\n".join(lines)


def _pm(mean: float, sd: float) -> str:
    return f"{mean:.2f}±{sd:.2f}" if math.isfinite(mean) else "-"


# ---- protocol B ----------------------------------------------------------------------------------


def protocol_b_rows(results: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One CSV row per (policy, admission, product): wait percentiles and run figures."""
    rows: list[dict[str, Any]] = []
    for (policy, admission), s in results.items():
        for product, w in s["waits"].items():
            rows.append({
                "policy": policy, "admission": admission, "product": product, "jobs": w["jobs"],
                "served": w["served"], "mean_wait_s": w["mean_s"], "p50_wait_s": w["p50_s"],
                "p90_wait_s": w["p90_s"], "p99_wait_s": w["p99_s"], "max_wait_s": w["max_s"],
                "over_sla": w["over_sla"], "utilisation_pct": s["utilisation_pct"],
                "offered_load": s["offered_load"], "stranded_pct": s["stranded_pct"],
                "fragmentation_cards": s["fragmentation_cards"],
            })
    return rows


def protocol_b_text(results: Mapping[tuple[str, str], Mapping[str, Any]], header: Mapping[str, Any]) -> str:
    """Waits per product in minutes and utilisation, one block per run: p50 / p90 / p99 / max pooled
    over the seeds' jobs, and the mean of the per-seed p99 with its 95 % interval."""
    runs = header.get("runs") or 1
    lines = [f"protocol B  {header.get('workload', '?')}  cards {header.get('cards')}  "
             f"ρ {_fmt(header.get('offered_load'))}  rounding {header.get('rounding')}  ties {header.get('ties')}  "
             f"scores {header.get('scores')}  seeds {header.get('seeds')}"]
    cap = header.get("runtime_cap")
    if cap:
        lines.append(runtime_cap_text(cap))
    for (policy, admission), s in results.items():
        lines.append("")
        lines.append(f"{policy} + {admission}: utilisation {s['utilisation_pct']:.1f} %, offered ρ "
                     f"{_fmt(s['offered_load'])}, cards in use {s['cards_in_use']:.1f} vs bound "
                     f"{s['lower_bound_cards']:.1f}, stranded {s['stranded_pct']:.2f} %, "
                     f"max wait {_minutes(s['max_wait_s'])} min, never started {s['never_started']}")
        if s.get("gangs"):
            lines.append(f"  {s['gangs']} multi-card jobs ran as pod groups of one-card pods (--gang), their waits "
                         "under their k-card class")
        lines.extend(_overload_lines(s))
        pooled = f"pooled over {runs} runs" if runs > 1 else "one run"
        seeded = "   p99 per seed: mean [95 % CI]" if runs > 1 else ""
        lines.append(f"  {'product':<14} {'jobs':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}{seeded}  "
                     f"(wait, min; jobs and p50..max {pooled})")
        spread = s.get("per_seed_p99") or {}
        for product in [*sorted((p for p in s["waits"] if p != "all"), key=product_order), "all"]:
            w = s["waits"][product]
            line = (f"  {product:<14} {w['jobs']:>7} {_minutes(w['p50_s']):>7} {_minutes(w['p90_s']):>7} "
                    f"{_minutes(w['p99_s']):>7} {_minutes(w['max_s']):>7}")
            if runs > 1 and product in spread:
                line += f"   {_spread(spread[product])}"
            lines.append(line)
        spaces = s.get("namespaces") or {}
        if 1 < len(spaces) <= MAX_NAMESPACE_LINES:
            shares = ", ".join(f"{ns} {v['served_share_pct']:.0f}/{v['demand_share_pct']:.0f} % "
                               f"(p99 {_minutes(v['p99_wait_s'])} min)" for ns, v in spaces.items())
            lines.append(f"  namespaces, GPU-time served/demanded: {shares}")
    return "\n".join(lines)


def runtime_cap_text(cap: Mapping[str, Any]) -> str:
    """What the runtime cap did: to the trace's jobs (the pool drawn from) and to the jobs simulated."""
    text = (f"runtimes capped at {_minutes(cap.get('runtime_cap_s'))} min: {cap.get('capped_jobs')} of the "
            f"{cap.get('jobs')} jobs in the trace's pool ({_fmt(cap.get('capped_pct'))} %) ran longer and were cut, "
            f"removing {_fmt(cap.get('gpu_time_removed_pct'))} % of its GPU-time")
    simulated = cap.get("simulated_jobs")
    if simulated:
        at_cap = cap.get("simulated_at_cap", 0)
        text += (f"; {at_cap} of the {simulated} jobs simulated (all seeds, {100.0 * at_cap / simulated:.2f} %) "
                 "run at the cap")
    return text + f"; {cap.get('dropped_never_ran')} never-run pods dropped"


def _spread(d: Mapping[str, Any]) -> str:
    mean, hw = d.get("mean"), d.get("ci95_half_width")
    if not isinstance(mean, (int, float)) or not math.isfinite(mean):
        return "-"
    if not isinstance(hw, (int, float)) or not math.isfinite(hw):
        return f"{mean / 60:.1f}"
    return f"{mean / 60:.1f} [{max(0.0, mean - hw) / 60:.1f}, {(mean + hw) / 60:.1f}]"


# ---- admission comparison ------------------------------------------------------------------------

QUARTER, WHOLE = "v100-25", "v100-100"  # the frontier's two products (the catalog's smallest and whole slice)


def admission_table_text(results: Mapping[tuple[str, str], Mapping[str, Any]],
                         saturated: Mapping[tuple[str, str], Mapping[str, Any]], header: Mapping[str, Any],
                         catalog: Catalog | None = None) -> str:
    """The admission strategies side by side: per product the pooled p99 and the mean of the per-seed
    p99 with its 95 % interval; utilisation, the longest wait and, when measured, the usable capacity
    (utilisation at the saturation load). With best effort among the runs (and ``catalog``), each
    other strategy also gets its worst-served product, that p99's ratio to best effort's worst, and
    the fairness goal's verdict (``simulations.fairness``); a product above 1.25 x its best-effort
    p99 + 5 min is marked ``!``."""
    runs = header.get("runs") or 1
    sat_rho = next((v.get("rho") for v in saturated.values()), None)
    lines = [f"admission comparison: {header.get('workload', '?')}, {header.get('cards')} cards, ρ "
             f"{_fmt(header.get('offered_load'))}, seeds {header.get('seeds')} ({runs} runs); waits in minutes",
             "  pooled p99: over every seed's jobs together; per-seed p99: the mean of each run's own p99, "
             "with the 95 % interval of that mean"]
    sat_head = f"  usable % at ρ {sat_rho}" if sat_rho is not None else ""
    lines.append(f"{'admission':<44} {'product':<12} {'pooled p99':>10}  {'per-seed p99 [95 % CI]':<24}"
                 f"{'max':>7} {'util %':>7}{sat_head}")
    for (policy, admission), s in results.items():
        label = admission if len({p for p, _ in results}) == 1 else f"{policy} + {admission}"
        spread = s.get("per_seed_p99") or {}
        products = [*sorted((p for p in s["waits"] if p != "all"), key=product_order), "all"]
        judged = _verdict(results, saturated, policy, admission, catalog)
        for i, product in enumerate(products):
            w = s["waits"][product]
            tail = ""
            if i == 0:
                tail = f"{_minutes(s['max_wait_s']):>7} {s['utilisation_pct']:>7.2f}"
                sat = saturated.get((policy, admission))
                if sat is not None:
                    hw = sat.get("utilisation_ci95_half_width")
                    pm = f" ± {hw:.2f}" if isinstance(hw, float) and math.isfinite(hw) else ""
                    tail += f"  {sat['utilisation_pct']:.2f}{pm}"
            mark = " !" if judged is not None and product in judged.sacrificed else ""
            line = (f"{label if i == 0 else '':<44} {product:<12} {_minutes(w['p99_s']):>10}  "
                    f"{_spread(spread.get(product) or {}) + mark:<24}{tail}")
            lines.append(line.rstrip())
        if judged is not None:
            lines.append(f"{'':<44} {verdict_text(judged)}")
    if catalog is not None and not any(a == fairness.REFERENCE for _, a in results):
        lines.append(f"(no verdicts: add {fairness.REFERENCE} to --admission to judge against it)")
    elif catalog is not None:
        lines.append("  ! : this product's p99 is above 1.25 x its best-effort p99 + 5 min (sacrificed; 'past the "
                     "limit by': the margin, its 95 % interval paired over seeds, 'within seed noise' where that "
                     "holds 0); minimax: the worst product's p99 over best effort's worst, goal <= 0.8 where best "
                     "effort's worst needs whole cards, else <= 1.0; not judged where best effort's worst is under "
                     "5 min")
    return "\n".join(lines)


def _verdict(results: Mapping[tuple[str, str], Mapping[str, Any]],
             saturated: Mapping[tuple[str, str], Mapping[str, Any]], policy: str, admission: str,
             catalog: Catalog | None) -> fairness.Verdict | None:
    """``admission``'s run judged against best effort's under the same placement policy (None: no such run)."""
    reference = results.get((policy, fairness.REFERENCE))
    if catalog is None or reference is None or admission == fairness.REFERENCE:
        return None
    return fairness.verdict(results[(policy, admission)], reference, catalog, saturated.get((policy, admission)),
                            saturated.get((policy, fairness.REFERENCE)))


def verdict_text(v: fairness.Verdict) -> str:
    """One line: the worst-served product, its ratio to best effort's worst, and what of the goal is missed."""
    missed = v.failures
    goal = (f"goal <= {v.goal_ratio:.1f}" if v.minimax_judged else
            f"not judged: best effort's worst {_minutes(v.reference_worst_p99_s)} min < 5 min")
    paired = (f"95 % interval paired over seeds {v.ratio_ci95[0]:.2f}..{v.ratio_ci95[1]:.2f}; "
              if v.ratio_ci95 is not None else "")
    return (f"worst {v.worst_product} {_minutes(v.worst_p99_s)} min = {v.ratio:.2f} x best effort's worst "
            f"({paired}{goal}); max wait {_minutes(v.max_wait_s)} against "
            f"{_minutes(v.reference_max_wait_s)}{_longest_text(v.longest_per_seed)}; "
            + ("goal met" if not missed else "missed: " + "; ".join(missed)) + _past_limit_text(v.past_limit))


def _past_limit_text(past: Sequence[tuple[str, tuple[float, float] | None]]) -> str:
    """Each sacrificed product's margin past its limit, paired over seeds, and whether seed noise could explain it."""
    parts = []
    for product, ci in past:
        if ci is not None:
            lo, hi = ci
            noise = " (within seed noise)" if lo <= 0 else ""
            parts.append(f"{product} {(lo + hi) / 120:+.1f} min, paired {lo / 60:+.1f}..{hi / 60:+.1f}{noise}")
    return f" (past the limit by: {'; '.join(parts)})" if parts else ""


def _longest_text(s: fairness.PerSeedLongest | None) -> str:
    """The longest wait seed by seed, beside the pooled one: means and the paired interval of the difference."""
    if s is None:
        return ""
    lo, hi = s.diff_ci95_s
    return (f" (per seed {_minutes(s.mean_s)} against {_minutes(s.reference_mean_s)} on average, paired "
            f"{lo / 60:+.1f}..{hi / 60:+.1f}; longer on {s.longer_seeds} of {s.seeds} seeds)")


def fairness_summary_text(blocks: Sequence[tuple[str, str, Mapping[tuple[str, str], Mapping[str, Any]],
                                                  Mapping[tuple[str, str], Mapping[str, Any]]]],
                          catalog: Catalog) -> str:
    """Every (workload, load) in one table: per strategy each product's p99 (mean of per-seed p99, minutes;
    ``!`` where sacrificed), the worst product and its ratio to best effort's worst, the longest wait,
    utilisation, usable capacity when measured, and the verdict."""
    wide = max([8, *(len(b[0]) for b in blocks)])
    labels = [a if len({p for p, _ in b[2]}) == 1 else f"{p} + {a}" for b in blocks for p, a in b[2]]
    named = max([9, *map(len, labels)])
    rows: list[tuple[str, ...]] = []
    for workload, rho, results, saturated in blocks:
        for (policy, admission), s in results.items():
            product, _ = fairness.worst(s)
            judged = _verdict(results, saturated, policy, admission, catalog)
            label = admission if len({p for p, _ in results}) == 1 else f"{policy} + {admission}"
            ratio = f"{judged.ratio:.2f}" if judged is not None else "1.00" if admission == fairness.REFERENCE else "-"
            if judged is not None and judged.ratio_ci95 is not None:
                ratio += f" ({judged.ratio_ci95[0]:.2f}..{judged.ratio_ci95[1]:.2f})"
            said = ("reference" if judged is None else "goal met" if not judged.failures
                    else "missed: " + "; ".join(judged.failures))
            if judged is not None and not judged.minimax_judged:
                said += " (minimax not judged: best effort's worst < 5 min)"
            p99 = fairness.p99_by_product(s)
            cells = "  ".join(f"{p} {_minutes(v)}{'!' if judged is not None and p in judged.sacrificed else ''}"
                              for p, v in sorted(p99.items(), key=lambda kv: product_order(kv[0])))
            sat = saturated.get((policy, admission))
            usable = f"{sat['utilisation_pct']:.2f}" if sat is not None else "-"
            rows.append((f"{workload:<{wide}} {rho:>5}  {label:<{named}}", cells, product, ratio,
                         _minutes(s["max_wait_s"]), f"{s['utilisation_pct']:.2f}", usable, said))
    cell = max([20, *(len(r[1]) for r in rows)])
    lines = ["fairness summary (minutes; each product's p99 is the mean of per-seed p99, ! where it is above "
             "1.25 x its best-effort p99 + 5 min; ratio = the worst product's p99 over best effort's worst, with its "
             "95 % interval paired over seeds):",
             f"{'workload':<{wide}} {'ρ':>5}  {'admission':<{named}} {'p99 per product':<{cell}}  {'worst':<11} "
             f"{'ratio':>17} {'max':>7} {'util %':>6} {'usable %':>8}  verdict"]
    for head, cells, product, ratio, longest, util, usable, said in rows:
        lines.append(f"{head} {cells:<{cell}}  {product:<11} {ratio:>17} {longest:>7} {util:>6} {usable:>8}  {said}")
    return "\n".join(lines)


def frontier_points(results: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per run: quarter and whole-card p99 (per-seed mean, its interval, and pooled), in minutes; empty
    when the workload lacks one of the two products."""
    points: list[dict[str, Any]] = []
    multi = len({p for p, _ in results}) > 1
    for (policy, admission), s in results.items():
        spread = s.get("per_seed_p99") or {}
        if QUARTER not in s["waits"] or WHOLE not in s["waits"] or QUARTER not in spread or WHOLE not in spread:
            continue
        q, w = spread[QUARTER], spread[WHOLE]
        points.append({
            "label": f"{policy} + {admission}" if multi else admission,
            "quarter": q["mean"] / 60, "quarter_hw": _hw_minutes(q), "whole": w["mean"] / 60,
            "whole_hw": _hw_minutes(w), "quarter_pooled": s["waits"][QUARTER]["p99_s"] / 60,
            "whole_pooled": s["waits"][WHOLE]["p99_s"] / 60,
        })
    return points


def _hw_minutes(d: Mapping[str, Any]) -> float:
    hw = d.get("ci95_half_width")
    return hw / 60 if isinstance(hw, (int, float)) and math.isfinite(hw) else 0.0


def _overload_lines(s: Mapping[str, Any]) -> list[str]:
    """What an offered load of 1 or more does: the line grows while jobs arrive, waits with the run's length."""
    rho = s.get("offered_load")
    if not isinstance(rho, (int, float)) or not rho >= 1.0:
        return []
    if not s.get("max_wait_s"):  # nothing queued: the jobs came in one short burst, too few to load the cards
        return [f"  ρ {_fmt(rho)} is measured over the short window in which the jobs arrive, and no job waited: "
                "too few jobs to load the cards, so this run says nothing about overload (--jobs resamples more)"]
    trend = s.get("mean_wait_by_arrival_fifth_s") or []
    growth = ""
    if len(trend) >= 2 and all(isinstance(t, (int, float)) and math.isfinite(t) for t in (trend[0], trend[-1])):
        growth = (f" (mean wait {_minutes(trend[0])} min for the first fifth of arrivals, "
                  f"{_minutes(trend[-1])} min for the last)")
    return [f"  overloaded: ρ {_fmt(rho)} >= 1, jobs arrive faster than the cards can serve them. The line grows "
            f"while they arrive{growth} and drains after the last;",
            "  these waits grow with the run's length (--jobs) and describe no steady state. "
            "`gpuslice plan` finds the cards that keep up."]


def _fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


# ---- sizing --------------------------------------------------------------------------------------


def plan_text(points: Sequence[tuple[int, float]], cards: int | None, target_s: float, label: str) -> str:
    lines = [f"sizing: smallest card count with {label} wait <= {_minutes(target_s)} min"]
    lines.append(f"  {'cards':>6} {'wait (min)':>11}")
    for n, w in points:
        mark = "  <- answer" if n == cards else ""
        lines.append(f"  {n:>6} {_minutes(w):>11}{mark}")
    lines.append(f"answer: {cards} cards" if cards is not None else "answer: no card count up to the cap meets it")
    return "\n".join(lines)
