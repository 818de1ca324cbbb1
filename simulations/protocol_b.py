"""Protocol B, the product's setting: departures, the queue, and waits per product.

Workloads come from a trace (``openb`` pods with runtimes = deletion − scheduled, capped; or our
own format) or from the synthetic generator. Load is shaped to a target ρ either by resampling
jobs into a Poisson stream (``arrivals="poisson"``, the reference study's method) or by
compressing the trace's own arrival times (``arrivals="trace"``); ``rho=None`` keeps the
workload's own timing. Every seed reruns the configuration with its own resampling, node order
and tie-breaking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packing.products import Catalog, Request
from simulations import metrics
from simulations.cluster import CardModel, build_ledger, card_model_for, card_nodes
from simulations.engine import EngineConfig, Simulation, simulate
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
