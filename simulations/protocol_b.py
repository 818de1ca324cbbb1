"""Protocol B, the product's setting: departures, the queue, and waits per product.

Workloads come from a trace (``openb`` pods with runtimes = deletion − scheduled, capped; or our
own format) or from the synthetic generator. Load is shaped to a target ρ either by resampling
jobs into a Poisson stream (``arrivals="poisson"``, the reference study's method) or by
compressing the trace's own arrival times (``arrivals="trace"``); ``rho=None`` keeps the
workload's own timing. Every seed reruns the configuration with its own resampling, node order
and tie-breaking.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packing.products import Catalog, Request
from simulations import metrics
from simulations.cluster import CardModel, build_ledger, card_model_for, card_nodes
from simulations.engine import NEVER, EngineConfig, Simulation, simulate
from simulations.synthetic import compress, resample
from simulations.traces import Job, NodeSpec
from simulations.workload import job_request

ARRIVALS = ("poisson", "trace")
DEFAULT_CARDS = 64  # the reference study's pool: queueing is a small-pool problem
DEFAULT_SEEDS = (1, 2, 3)

PoolSource = Sequence[Job] | Callable[[int], Sequence[Job]]  # a fixed pool, or one per seed


class ProtocolBError(ValueError):
    """A protocol B run that cannot be set up (unknown arrivals mode, no runtimes, no cards)."""


@dataclass(frozen=True)
class ProtocolBConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    rounding: str = "slices"
    rho: float | None = 0.85  # None: the workload's own timing
    arrivals: str = "poisson"
    jobs: int | None = None  # Poisson resampling: how many arrivals (default: as many as the pool)
    sla_s: float = metrics.DEFAULT_SLA_S

    def __post_init__(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ProtocolBError(f"unknown arrivals {self.arrivals!r}; choose one of {', '.join(ARRIVALS)}")
        if self.rho is not None and not self.rho > 0:
            raise ProtocolBError(f"offered load must be positive, got {self.rho}")
        if self.jobs is not None and self.jobs < 1:
            raise ProtocolBError(f"need at least one job, got {self.jobs}")


@dataclass
class ProtocolBResult:
    config: ProtocolBConfig
    simulations: list[Simulation]
    factor: float | None = None  # trace time compression, when used

    def pooled(self) -> dict[str, object]:
        return metrics.pooled(self.simulations, self.config.sla_s)

    def per_seed(self, q: float = 99.0) -> dict[str, SeedSpread]:
        """Per product (and ``all``): the q-th percentile wait of each seed's run, their mean and its
        95 % confidence interval -- beside the pooled figure, which mixes the seeds' jobs."""
        return per_seed_percentiles(self.simulations, q)

    def capped_jobs(self, cap_s: float | None) -> int:
        """How many of the simulated jobs (every seed) run exactly the runtime cap."""
        if cap_s is None:
            return 0
        return sum(1 for sim in self.simulations for r in sim.runtime if r != NEVER and r >= cap_s)

    def simulated_jobs(self) -> int:
        return sum(len(sim.arrival) for sim in self.simulations)


# Student's t, 97.5 % quantile, by degrees of freedom: the 95 % interval of a mean over few seeds
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(dof: int) -> float:
    """Student's t 97.5 % quantile for ``dof`` >= 1 degrees of freedom (the next tabulated one down)."""
    if dof < 1:
        raise ValueError("a confidence interval needs at least two values")
    return _T975[max(k for k in _T975 if k <= dof)] if dof <= 120 else 1.960


@dataclass(frozen=True)
class SeedSpread:
    """One figure measured once per seed: the values, their mean and the 95 % interval of the mean."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def half_width(self) -> float:
        """Half the 95 % confidence interval of the mean (t-distribution); NaN with one value."""
        finite = [v for v in self.values if math.isfinite(v)]
        if len(finite) != len(self.values) or len(finite) < 2:
            return math.nan
        return t975(len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite))

    def as_dict(self) -> dict[str, object]:
        return {"per_seed": list(self.values), "mean": self.mean, "ci95_half_width": self.half_width}


def per_seed_percentiles(sims: Sequence[Simulation], q: float) -> dict[str, SeedSpread]:
    """The q-th percentile wait per product of every run (a product a run lacks counts as NaN)."""
    runs = [metrics.waits_by_class(sim) for sim in sims]
    products = sorted({p for w in runs for p in w})
    out: dict[str, SeedSpread] = {}
    for product in products:
        values = []
        for waits in runs:
            stats = waits.get(product)
            values.append(math.nan if stats is None else _quantile(stats, q))
        out[product] = SeedSpread(tuple(values))
    return out


def _quantile(stats: metrics.WaitStats, q: float) -> float:
    by_q = {50.0: stats.p50_s, 90.0: stats.p90_s, 99.0: stats.p99_s}
    if float(q) not in by_q:
        raise ValueError(f"per-seed percentiles are kept for {sorted(by_q)}, not {q}")
    return by_q[float(q)]


def timed_jobs(pool: Sequence[Job]) -> list[Job]:
    """The jobs that carry a runtime; ProtocolBError when none does."""
    timed = [j for j in pool if j.duration is not None]
    if not timed:
        raise ProtocolBError("protocol B needs jobs with runtimes; none of these has one")
    return timed


def card_for(catalog: Catalog, rounding: str, requests: Sequence[Request]) -> CardModel:
    """Catalog cards when requests name products (or are rounded to them); the trace's GPUs otherwise."""
    sliced = rounding == "slices" or any(r.memory_mib or r.model for r in requests)
    return card_model_for(catalog, "slices" if sliced else "none")


def shaped_jobs(pool: Sequence[Job], requests: Sequence[Request], capacity_milli: int, config: ProtocolBConfig,
                seed: int) -> tuple[list[Job], list[Request], float | None]:
    """The jobs of one seed's run at the configured load against ``capacity_milli``, and their requests."""
    if config.rho is None:
        return list(pool), list(requests), None
    sizes = [r.milli for r in requests]
    if config.arrivals == "trace":
        jobs, factor = compress(pool, sizes, config.rho, capacity_milli)
        return jobs, list(requests), factor
    jobs, picks = resample(pool, sizes, config.jobs or len(pool), config.rho, capacity_milli, seed)
    return jobs, [requests[i] for i in picks], None


def seed_workload(source: PoolSource, catalog: Catalog, config: ProtocolBConfig, shaping_milli: int,
                  seed: int) -> tuple[list[Job], list[Request], float | None]:
    """One seed's jobs and requests, shaped against ``shaping_milli`` of capacity."""
    pool = timed_jobs(source(seed) if callable(source) else source)
    requests = [job_request(j, catalog, config.rounding) for j in pool]
    return shaped_jobs(pool, requests, shaping_milli, config, seed)


def run(source: PoolSource, catalog: Catalog, config: ProtocolBConfig, seeds: Sequence[int],
        nodes: Sequence[NodeSpec] | None = None, cards: int | None = None, card: CardModel | None = None,
        track_host: bool = False, shaping_cards: int | None = None,
        progress: Callable[[int, int], None] | None = None) -> ProtocolBResult:
    """Protocol B of ``source`` on ``nodes`` (or ``cards`` synthetic V100 cards), once per seed.

    ``shaping_cards``: shape the load against this many cards instead of the cluster's own
    (sizing keeps the workload fixed while the cluster changes).
    """
    if nodes is None:
        nodes = card_nodes(cards or DEFAULT_CARDS)
    sims: list[Simulation] = []
    factor: float | None = None
    for k, seed in enumerate(seeds):
        capacity = 1000 * sum(n.gpus for n in nodes)
        shaping = 1000 * shaping_cards if shaping_cards is not None else capacity
        jobs, reqs, factor = seed_workload(source, catalog, config, shaping, seed)
        model = card if card is not None else card_for(catalog, config.rounding, reqs)
        ledger = build_ledger(nodes, model, seed=seed, track_host=track_host)

        def step(done: int, total: int, k: int = k) -> None:
            if progress is not None:
                progress(k * total + done, total * len(seeds))

        sims.append(simulate(ledger, jobs, reqs, config.engine, seed, step))
    return ProtocolBResult(config, sims, factor)
