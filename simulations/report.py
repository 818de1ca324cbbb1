"""Reports: JSON and CSV files and the one-screen text summary (plots are in ``plots``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulations.protocol_a import CURVE_MAX_PCT

# Published unallocated GPU % at arrived 100 % on openb ``default`` (FGD, ATC'23; mean of 10 seeds)
PUBLISHED_DEFAULT = {"fgd": 4.77, "go-best-fit": 7.14, "gpu-packing": 8.22, "gpu-clustering": 8.35,
                     "dot-product": 9.38, "random": 13.70}


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


def protocol_a_text(results: Mapping[str, Mapping[str, Any]], header: Mapping[str, Any]) -> str:
    """The protocol A table: unallocated GPU % at arrived 100 %, ours against the published."""
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
    lines.append("unallocated GPU % = 100 − mean allocation % over arrival events with round(arrived %) = 100")
    return "\n".join(lines)


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
    """Waits per product in minutes (p50 / p90 / p99 / max) and utilisation, one block per run."""
    lines = [f"protocol B  {header.get('workload', '?')}  cards {header.get('cards')}  "
             f"ρ {_fmt(header.get('offered_load'))}  rounding {header.get('rounding')}  ties {header.get('ties')}  "
             f"scores {header.get('scores')}  seeds {header.get('seeds')}"]
    cap = header.get("runtime_cap")
    if cap:
        lines.append(f"runtimes capped at {_minutes(cap.get('runtime_cap_s'))} min: {cap.get('capped_jobs')} jobs "
                     f"({_fmt(cap.get('capped_pct'))} %) capped, {_fmt(cap.get('gpu_time_removed_pct'))} % of "
                     f"GPU-time removed; {cap.get('dropped_never_ran')} never-run pods dropped")
    for (policy, admission), s in results.items():
        lines.append("")
        lines.append(f"{policy} + {admission}: utilisation {s['utilisation_pct']:.1f} %, offered ρ "
                     f"{_fmt(s['offered_load'])}, cards in use {s['cards_in_use']:.1f} vs bound "
                     f"{s['lower_bound_cards']:.1f}, stranded {s['stranded_pct']:.2f} %, "
                     f"max wait {_minutes(s['max_wait_s'])} min, never started {s['never_started']}")
        lines.append(f"  {'product':<14} {'jobs':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}  (wait, min)")
        for product, w in s["waits"].items():
            lines.append(f"  {product:<14} {w['jobs']:>7} {_minutes(w['p50_s']):>7} {_minutes(w['p90_s']):>7} "
                         f"{_minutes(w['p99_s']):>7} {_minutes(w['max_s']):>7}")
        spaces = s.get("namespaces") or {}
        if 1 < len(spaces) <= MAX_NAMESPACE_LINES:
            shares = ", ".join(f"{ns} {v['served_share_pct']:.0f}/{v['demand_share_pct']:.0f} % "
                               f"(p99 {_minutes(v['p99_wait_s'])} min)" for ns, v in spaces.items())
            lines.append(f"  namespaces, GPU-time served/demanded: {shares}")
    return "\n".join(lines)


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
