"""Protocol B metrics from one engine run: waits per product, utilisation, fragmentation against
the lower bound, stranded capacity, fairness per namespace and starvation.

Waits are admission − arrival (seconds); a job that never started counts as unserved, not as a
wait. Time-weighted figures cover the measured window [first arrival, last arrival], so the
drain after the last arrival does not dilute them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from simulations.engine import NEVER, Simulation

PERCENTILES = (50, 90, 99)
DEFAULT_SLA_S = 3600.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of an ascending sequence; NaN if empty."""
    if not sorted_values:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    a, b = sorted_values[lo], sorted_values[hi]
    if math.isinf(b):  # never-served jobs count as infinite waits
        return b if pos > lo or math.isinf(a) else a
    return a + (b - a) * (pos - lo)


@dataclass(frozen=True)
class WaitStats:
    jobs: int
    served: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    over_sla: int

    @classmethod
    def of(cls, waits: Sequence[float], jobs: int, sla_s: float) -> WaitStats:
        ordered = sorted(waits)
        mean = sum(ordered) / len(ordered) if ordered else float("nan")
        return cls(jobs, len(ordered), mean, percentile(ordered, 50), percentile(ordered, 90),
                   percentile(ordered, 99), ordered[-1] if ordered else float("nan"),
                   sum(1 for w in ordered if w > sla_s))

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def waits_by_class(sim: Simulation, sla_s: float = DEFAULT_SLA_S) -> dict[str, WaitStats]:
    """Wait statistics per size class (product), plus ``all``."""
    per: dict[int, list[float]] = {i: [] for i in range(len(sim.classes))}
    jobs: dict[int, int] = dict.fromkeys(range(len(sim.classes)), 0)
    everything: list[float] = []
    for cls, a, s in zip(sim.job_class, sim.arrival, sim.start, strict=True):
        jobs[cls] += 1
        if s != NEVER:
            per[cls].append(s - a)
            everything.append(s - a)
    out = {sim.classes[i]: WaitStats.of(per[i], jobs[i], sla_s) for i in sorted(per, key=lambda i: sim.classes[i])}
    out["all"] = WaitStats.of(everything, len(sim.arrival), sla_s)
    return out


def offered_load(sim: Simulation) -> float:
    """ρ = Σ size × runtime of jobs arriving in the window / (capacity × window length)."""
    t0, t1 = sim.window
    span = t1 - t0
    if span <= 0:
        return float("nan")
    work = sum(float(m) * r for m, r in zip(sim.job_milli, sim.runtime, strict=True) if r != NEVER)
    return work / (sim.capacity_milli * span)


def namespace_shares(sim: Simulation) -> dict[str, dict[str, float]]:
    """Per namespace: share of GPU demand, share of GPU-time served, mean and p99 wait."""
    return pooled_namespaces([sim])


def pooled_namespaces(sims: Sequence[Simulation]) -> dict[str, dict[str, float]]:
    """Namespace shares over several runs (GPU-time demanded and served, waits pooled)."""
    demand: dict[str, float] = {}
    served: dict[str, float] = {}
    waits: dict[str, list[float]] = {}
    for sim in sims:
        for ns, m, a, s, r in zip(sim.job_namespace, sim.job_milli, sim.arrival, sim.start, sim.runtime,
                                  strict=True):
            name = sim.namespaces[ns]
            run = r if r != NEVER else 0.0
            demand[name] = demand.get(name, 0.0) + m * run
            served.setdefault(name, 0.0)
            bucket = waits.setdefault(name, [])
            if s != NEVER:
                served[name] += m * run
                bucket.append(s - a)
    total_demand = sum(demand.values()) or 1.0
    total_served = sum(served.values()) or 1.0
    out: dict[str, dict[str, float]] = {}
    for name in sorted(demand):
        ordered = sorted(waits[name])
        out[name] = {
            "demand_share_pct": 100.0 * demand[name] / total_demand,
            "served_share_pct": 100.0 * served[name] / total_served,
            "mean_wait_s": sum(ordered) / len(ordered) if ordered else float("nan"),
            "p99_wait_s": percentile(ordered, 99),
        }
    return out


def waits_max(sim: Simulation) -> float:
    """The longest wait of any job that started (0 when none did)."""
    return max((s - a for a, s in zip(sim.arrival, sim.start, strict=True) if s != NEVER), default=0.0)


def summary(sim: Simulation, sla_s: float = DEFAULT_SLA_S) -> dict[str, object]:
    """Everything the report shows about one run, JSON-ready."""
    waits = waits_by_class(sim, sla_s)
    longest = waits_max(sim)
    return {
        "cards": sim.cards,
        "jobs": len(sim.arrival),
        "offered_load": offered_load(sim),
        "window_s": sim.window[1] - sim.window[0],
        "waits": {k: v.as_dict() for k, v in waits.items()},
        "utilisation_pct": sim.mean_allocated_pct,
        "cards_in_use": sim.mean_cards_in_use,
        "lower_bound_cards": sim.mean_lower_bound_cards,
        "fragmentation_cards": sim.mean_cards_in_use - sim.mean_lower_bound_cards,
        "idle_while_waiting_pct": sim.idle_while_waiting_pct,
        "stranded_pct": sim.stranded_pct,
        "mean_waiting": sim.mean_waiting,
        "starvation": {
            "max_wait_s": longest,
            "over_sla": waits["all"].over_sla,
            "sla_s": sla_s,
            "never_started": sim.still_waiting,
        },
        "namespaces": namespace_shares(sim),
        "utilisation_over_time_pct": sim.buckets,
        "expired_reservations": sim.expired_reservations,
        "backfilled": sim.backfilled,
        "gangs": sim.gangs,
        "events": sim.events,
        "seconds": sim.seconds,
        "events_per_s": sim.events / sim.seconds if sim.seconds > 0 else float("nan"),
    }


def pooled(sims: Sequence[Simulation], sla_s: float = DEFAULT_SLA_S) -> dict[str, object]:
    """Seeds pooled: waits from every run together, time-weighted figures averaged over runs."""
    if not sims:
        raise ValueError("nothing to pool")
    per: dict[str, list[float]] = {}
    jobs: dict[str, int] = {}
    for sim in sims:
        for cls, a, s in zip(sim.job_class, sim.arrival, sim.start, strict=True):
            name = sim.classes[cls]
            jobs[name] = jobs.get(name, 0) + 1
            bucket = per.setdefault(name, [])
            if s != NEVER:
                bucket.append(s - a)
    waits = {name: WaitStats.of(per[name], jobs[name], sla_s).as_dict() for name in sorted(per)}
    waits["all"] = WaitStats.of([w for v in per.values() for w in v], sum(jobs.values()), sla_s).as_dict()
    n = len(sims)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / n

    buckets = [sum(x.buckets[i] for x in sims) / n for i in range(len(sims[0].buckets))]
    return {
        "runs": n,
        "cards": sims[0].cards,
        "offered_load": mean([offered_load(x) for x in sims]),
        "waits": waits,
        "utilisation_pct": mean([x.mean_allocated_pct for x in sims]),
        "cards_in_use": mean([x.mean_cards_in_use for x in sims]),
        "lower_bound_cards": mean([x.mean_lower_bound_cards for x in sims]),
        "fragmentation_cards": mean([x.mean_cards_in_use - x.mean_lower_bound_cards for x in sims]),
        "idle_while_waiting_pct": mean([x.idle_while_waiting_pct for x in sims]),
        "stranded_pct": mean([x.stranded_pct for x in sims]),
        "max_wait_s": max(waits_max(x) for x in sims),
        "never_started": sum(x.still_waiting for x in sims),
        "gangs": sum(x.gangs for x in sims),
        "namespaces": pooled_namespaces(sims),
        "utilisation_over_time_pct": buckets,
        "events": sum(x.events for x in sims),
        "seconds": sum(x.seconds for x in sims),
    }


def mean_wait_by_arrival(sims: Sequence[Simulation], parts: int = 5) -> list[float]:
    """Mean wait (s) of the jobs arriving in each of ``parts`` equal spans of every run's window, runs
    pooled: flat when the cluster keeps up, rising when the line grows (an overloaded run). A job that
    never started counts with the wait it had at the run's end. NaN for a span without arrivals."""
    total = [0.0] * parts
    count = [0] * parts
    for sim in sims:
        lo, hi = sim.window
        span = max(hi - lo, 1e-9)
        end = max(max((s for s in sim.start if s != NEVER), default=hi), hi)
        for a, s in zip(sim.arrival, sim.start, strict=True):
            k = min(parts - 1, max(0, int((a - lo) / span * parts)))
            total[k] += (end if s == NEVER else s) - a
            count[k] += 1
    return [t / c if c else math.nan for t, c in zip(total, count, strict=True)]


def product_order(name: str) -> tuple[int, int, str]:
    """Products by cards then size (``v100-25`` < ``v100-50`` < ``v100-100`` < ``v100-100x2``), others after."""
    m = re.search(r"(\d+)(?:x(\d+))?$", name)
    if m is None:
        return (1 << 30, 0, name)
    return (int(m.group(2) or 1), int(m.group(1)), name)
