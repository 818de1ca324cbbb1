"""The discrete-event engine: arrivals, departures, binds and reservation expiry, driving the
``packing`` queue and ledger exactly as the extender's queue controller does.

Each event time is one step: departures release their slices (``ClaimQueue.depart``), binds
commit reservations, arrivals join the line (``ClaimQueue.arrive``), lapsed reservations go back
in line (``ClaimQueue.expire``), then one admission step (``ClaimQueue.admit``) starts whatever
the admission policy lets in, placed by the policy under the scheduler model. With a reservation
TTL and a bind delay, admission only reserves; the bind comes after an exponential latency and
commits, or finds the reservation lapsed (the claim is back in line and is admitted again). With
``gang``, a job of k > 1 whole cards is k one-card pods of one pod group (``WaitingClaim.group``):
admitted together anywhere they fit, bound together, ended together. Deterministic for a seed: one
random generator, seeded once, and no wall-clock or hash-order dependence.

The engine keeps per-job arrays and time-weighted accumulators; ``simulations.metrics`` turns
them into the report.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from packing.entitlements import Entitlement
from packing.ledger import Allocation
from packing.policies import DEFAULT_POLICY
from packing.products import Request, model_accepts
from packing.queue import DEFAULT_ADMISSION, Admission, ClaimQueue, MemberOf, WaitingClaim, WorstFirstSettings
from simulations.cluster import TrackedLedger
from simulations.scheduler import ModelledPolicy, Scheduler, SchedulerModel, run_policy
from simulations.traces import Job
from simulations.workload import size_class

_DEPART, _BIND, _WAKE = 0, 1, 2  # same-time order: free capacity first, then commit, then wake-ups
NEVER = math.inf


class EngineError(ValueError):
    """A simulation that cannot run as configured (no jobs, jobs without runtimes, bad delays)."""


@dataclass(frozen=True)
class EngineConfig:
    """Placement policy, admission policy and the path through kube-scheduler."""

    policy: str = DEFAULT_POLICY
    admission: str = DEFAULT_ADMISSION
    model: SchedulerModel = field(default_factory=SchedulerModel)
    age_limit_s: float | None = None  # T of every product without its own; None: the strategy's defaults
    age_limits: tuple[tuple[str, float], ...] = ()  # per product: (product, T) over age_limit_s
    max_drain_targets: int | None = None  # None: the admission strategy's default
    drain_horizon_s: float | None = None  # drain-soonest's horizon; None: its default
    head_starts: tuple[tuple[str, float], ...] = ()  # (kind, seconds ahead in queue order): a what-if
    worst_first: WorstFirstSettings | None = None  # clock, share, within, front, idle, spare; None: defaults
    reservation_ttl_s: float | None = None  # None: admission commits at once (the bind never fails)
    bind_delay_s: float = 0.0  # mean admission-to-bind latency (exponential); a bind after the TTL lapses
    declare_limits: bool = False  # jobs declare their runtime as an enforced limit (enables backfill)
    sample_points: int = 400  # buckets of the utilisation-over-time series
    use_index: bool = False
    prior: tuple[Request, ...] = ()  # what the policy's mix estimator starts from (the extender's: the catalog)
    record_placements: bool = False  # keep every admission's (job, node, GPUs, time) in Simulation.placements
    entitlements: tuple[tuple[str, Entitlement], ...] = ()  # (namespace, its entitlement), as the extender's ConfigMap
    gang: bool = False  # a job of k > 1 whole cards runs as k one-card pods of one pod group

    def __post_init__(self) -> None:
        if self.bind_delay_s < 0:
            raise EngineError(f"bind delay must be >= 0, got {self.bind_delay_s}")
        if self.bind_delay_s > 0 and self.reservation_ttl_s is None:
            raise EngineError("a bind delay needs a reservation TTL (reserve at admission, commit at bind)")
        if self.sample_points < 1:
            raise EngineError("need at least one sample point")


@dataclass(frozen=True)
class RunningClaim:
    """A claim holding its slice when the run starts (``simulate --from-cluster``): it departs after ``remaining``
    seconds (None: not within the run)."""

    claim: str
    request: Request
    node: str
    gpus: tuple[str, ...]
    namespace: str = "default"
    remaining: float | None = None
    time_limit: float | None = None


@dataclass(frozen=True)
class ClusterStart:
    """Where a run starts instead of an empty cluster: at ``t0``, the ``running`` claims hold their slices, the
    jobs that arrived before ``t0`` wait in line (in their arrival order), and the policy has observed
    ``observed`` (a claim's request as it arrived, None for a bound claim's departure), as the extender had."""

    t0: float
    running: tuple[RunningClaim, ...] = ()
    observed: tuple[Request | None, ...] = ()
    withdrawn: tuple[str, ...] = ()  # GPUs that take no new placement (what they hold stays)
    line: frozenset[str] = frozenset()  # the jobs (by name) waiting at t0: observed already, as ``observed`` says


@dataclass
class Simulation:
    """Raw results of one run: per-job arrays (index = job), classes, and time-weighted sums."""

    capacity_milli: int
    cards: int
    classes: list[str]
    namespaces: list[str]
    job_class: array[int]  # index into classes
    job_namespace: array[int]  # index into namespaces
    job_milli: array[int]  # total milli-GPU of each job
    arrival: array[float]
    start: array[float]  # NEVER: never started
    runtime: array[float]  # NEVER: runs forever
    window: tuple[float, float]  # [first arrival, last arrival]: the measured period
    buckets: list[float]  # mean allocated % of capacity per time bucket of the window
    mean_allocated_pct: float
    mean_cards_in_use: float
    mean_lower_bound_cards: float
    mean_waiting: float
    idle_while_waiting_pct: float  # free capacity % averaged over time, counted only while claims wait
    stranded_pct: float  # free capacity % no waiting request could use, averaged over the samples
    stranded_samples: int
    events: int
    seconds: float
    expired_reservations: int = 0
    backfilled: int = 0
    still_waiting: int = 0
    placements: list[tuple[str, str, tuple[str, ...], float]] = field(default_factory=list)  # (job, node, GPUs, t)
    gangs: int = 0  # jobs run as pod groups (``EngineConfig.gang``)


class _Clock:
    """Time-weighted accumulators over the measured window, and the utilisation buckets."""

    def __init__(self, start: float, end: float, buckets: int, capacity: int) -> None:
        self.t0 = start
        self.t1 = end if end > start else start + 1.0
        self.width = (self.t1 - self.t0) / buckets or self.t1 - self.t0  # a window of ~1e-320 s underflows to 0
        self.buckets = [0.0] * buckets
        self.capacity = capacity
        self.sums = {"alloc": 0.0, "cards": 0.0, "bound": 0.0, "waiting": 0.0, "idle_waiting": 0.0}
        self.last = start

    def advance(self, now: float, alloc: int, cards: int, waiting: int) -> None:
        """Account the state held since the last event up to ``now`` (clipped to the window)."""
        a, b = max(self.last, self.t0), min(now, self.t1)
        self.last = max(self.last, now)
        if b <= a:
            return
        dt = b - a
        s = self.sums
        s["alloc"] += alloc * dt
        s["cards"] += cards * dt
        s["bound"] += math.ceil(alloc / 1000) * dt
        s["waiting"] += waiting * dt
        if waiting:
            s["idle_waiting"] += (self.capacity - alloc) * dt
        i = int((a - self.t0) / self.width)
        while a < b and i < len(self.buckets):
            edge = min(b, self.t0 + (i + 1) * self.width)
            self.buckets[i] += alloc * (edge - a)
            a = edge
            i += 1

    def mean(self, key: str) -> float:
        return self.sums[key] / (self.t1 - self.t0)


def stranded_milli(ledger: TrackedLedger, waiting: Sequence[Request]) -> int:
    """Free milli on cards where no waiting request's slice fits (card by card, host ignored)."""
    shapes = {(r.whole, r.milli, r.memory_mib, r.model) for r in waiting if not r.gpu_less}
    if not shapes:
        return 0
    stranded = 0
    for g in ledger.gpus.values():
        if g.free_milli == 0:
            continue
        usable = any(
            (g.empty if whole else g.free_milli >= milli and g.free_mib >= mib)
            and model_accepts(model, g.model)
            for whole, milli, mib, model in shapes
        )
        if not usable:
            stranded += g.free_milli
    return stranded


def claims_of(j: int, request: Request, gang: bool) -> list[tuple[str, Request, MemberOf | None]]:
    """The claims job ``j`` runs as: ``j<j>`` alone, or with ``gang`` a k-card whole request as k
    one-card members ``j<j>.<i>`` of pod group ``j<j>``."""
    if gang and request.whole and request.count > 1:
        one = replace(request, count=1)
        tag = MemberOf(f"j{j}", request.count)
        return [(f"j{j}.{i}", one, tag) for i in range(request.count)]
    return [(f"j{j}", request, None)]


def job_of(claim: str) -> int:
    """The job index of a claim id ``j<j>`` or ``j<j>.<i>``."""
    return int(claim[1:].partition(".")[0])


def simulate(ledger: TrackedLedger, jobs: Sequence[Job], requests: Sequence[Request], config: EngineConfig,
             seed: int, progress: Callable[[int, int], None] | None = None,
             initial: ClusterStart | None = None) -> Simulation:
    """Run ``jobs`` (sorted by arrival, with ``requests`` alongside) through queue and ledger; from ``initial``
    when given (a live cluster's state), else from an empty cluster at the first arrival."""
    if not jobs and initial is None:
        raise EngineError("no jobs to simulate")
    if len(jobs) != len(requests):
        raise EngineError(f"{len(jobs)} jobs but {len(requests)} requests")
    if any(jobs[i].arrival > jobs[i + 1].arrival for i in range(len(jobs) - 1)):
        raise EngineError("jobs must be sorted by arrival")
    started = time.perf_counter()
    policy = run_policy(config.policy, requests, seed, config.prior)
    scheduler = Scheduler(ledger, policy, config.model, seed=seed, use_index=config.use_index)
    rng = random.Random(seed + 1)  # bind latencies; the scheduler's generator breaks ties
    queue = ClaimQueue(ledger, ModelledPolicy.wrap(scheduler), config.admission, age_limits=dict(config.age_limits),
                       reservation_ttl=config.reservation_ttl_s, default_age_limit=config.age_limit_s,
                       max_drain_targets=config.max_drain_targets, drain_horizon=config.drain_horizon_s,
                       head_starts=dict(config.head_starts), worst_first=config.worst_first)
    for namespace, entitlement in config.entitlements:
        queue.set_entitlement(namespace, entitlement)
    capacity = ledger.capacity_milli()
    n = len(jobs)
    classes: dict[str, int] = {}
    namespaces: dict[str, int] = {}
    job_class = array("i", (classes.setdefault(size_class(r), len(classes)) for r in requests))
    job_ns = array("i", (namespaces.setdefault(j.namespace, len(namespaces)) for j in jobs))
    job_milli = array("q", (r.total_milli for r in requests))
    arrival = array("d", (j.arrival for j in jobs))
    runtime = array("d", (NEVER if j.duration is None else j.duration for j in jobs))
    start = array("d", [NEVER]) * n
    generation = array("i", [0]) * n
    t0 = initial.t0 if initial is not None else jobs[0].arrival
    clock = _Clock(t0, max(t0, jobs[-1].arrival) if jobs else t0, config.sample_points, capacity)
    holders: dict[str, int] = {}
    state = {"alloc": 0, "cards": 0}
    stranded_sum = 0.0
    stranded_samples = 0
    next_sample = clock.t0
    expired_total = backfilled = 0
    placements: list[tuple[str, str, tuple[str, ...], float]] = []
    heap: list[tuple[float, int, int, int]] = []  # (time, kind, job, generation)
    members = [[c for c, _, _ in claims_of(j, r, config.gang)] for j, r in enumerate(requests)]
    events = 0
    next_report = 0
    next_job = 0
    total_events = n + sum(1 for j in jobs if j.duration is not None)

    def take(alloc: Allocation) -> None:
        state["alloc"] += alloc.request.total_milli
        for share in alloc.shares:
            held = holders.get(share.uuid, 0)
            holders[share.uuid] = held + 1
            state["cards"] += held == 0

    def give(alloc: Allocation) -> None:
        state["alloc"] -= alloc.request.total_milli
        for share in alloc.shares:
            held = holders[share.uuid] - 1
            holders[share.uuid] = held
            state["cards"] -= held == 0

    if initial is not None:  # the live cluster: what the policy saw, the slices held, then the line at t0
        for seen in initial.observed:
            if seen is None:
                policy.observe_departure()
            else:
                policy.observe(seen)
        for i, held in enumerate(initial.running):
            claim = f"j{n + i}"
            members.append([claim])  # a live slice departs as one claim
            alloc = ledger.assign(claim, held.request, held.node, held.gpus)
            queue.start(claim, held.namespace, held.request, t0, held.time_limit)
            take(alloc)
            if held.remaining is not None:
                heapq.heappush(heap, (t0 + held.remaining, _DEPART, n + i, 0))
        for uuid in initial.withdrawn:
            ledger.withdraw(uuid)  # after the slices they hold are placed
        total_events += sum(1 for h in initial.running if h.remaining is not None)
    while next_job < n or heap:
        now = min(arrival[next_job] if next_job < n else NEVER, heap[0][0] if heap else NEVER)
        if initial is not None:
            now = max(now, t0)  # the line at t0: claims that arrived earlier join it now, at their own times
        clock.advance(now, state["alloc"], state["cards"], queue.waiting())
        while heap and heap[0][0] <= now:
            _, kind, j, gen = heapq.heappop(heap)
            if kind == _DEPART:
                for claim in members[j]:
                    alloc = ledger.allocations[claim]
                    queue.depart(claim, now)
                    policy.observe_departure()  # the load phase counts every departure, as the extender does
                    give(alloc)
                events += 1
            elif kind == _BIND and generation[j] == gen and all(c in ledger.allocations for c in members[j]):
                for claim in members[j]:  # a group's members lapse together, so they bind together
                    ledger.commit(claim)
                heapq.heappush(heap, (now + runtime[j], _DEPART, j, gen))
        while next_job < n and arrival[next_job] <= now:
            job = jobs[next_job]
            if initial is None or job.name not in initial.line:  # the live line was observed (initial.observed)
                policy.observe(requests[next_job])  # the mix estimator and the phase see every arrival, as the extender
            limit = job.duration if config.declare_limits else None
            for claim, request, tag in claims_of(next_job, requests[next_job], config.gang):
                queue.arrive(WaitingClaim(claim, job.namespace, request, arrived_at=job.arrival,
                                          priority=job.priority, time_limit=limit, group=tag))
            next_job += 1
            events += 1
        for alloc in queue.expire(now):
            give(alloc)
            expired_total += 1
        by_job: dict[int, list[Admission]] = {}  # a group's members all start in one step
        for adm in queue.admit(now):
            by_job.setdefault(job_of(adm.claim), []).append(adm)
        for j, adms in by_job.items():
            assert len(adms) == len(members[j]), f"job {j}: {len(adms)} of its {len(members[j])} pods started"
            generation[j] += 1
            start[j] = now
            for adm in adms:
                take(adm.allocation)
                if config.record_placements:
                    placements.append((jobs[j].name, adm.allocation.node, adm.allocation.gpus, now))
                backfilled += adm.backfill
            if config.bind_delay_s > 0:
                delay = rng.expovariate(1.0 / config.bind_delay_s)
                heapq.heappush(heap, (now + delay, _BIND, j, generation[j]))
                expires = adms[0].allocation.expires_at
                assert expires is not None
                heapq.heappush(heap, (expires, _WAKE, j, generation[j]))
            else:
                for adm in adms:
                    if adm.allocation.reserved:
                        ledger.commit(adm.claim)
                if runtime[j] != NEVER:
                    heapq.heappush(heap, (now + runtime[j], _DEPART, j, generation[j]))
        if now >= next_sample and now <= clock.t1 and queue.waiting():
            waiting = [w.request for w in queue.in_order()]
            stranded_sum += stranded_milli(ledger, waiting)
            stranded_samples += 1
            next_sample = now + clock.width
        if progress is not None and events >= next_report:
            progress(events, total_events)
            next_report = events + max(1, total_events // 200)
    if progress is not None:
        progress(total_events, total_events)
    still = sum(1 for s in start if s == NEVER)
    return Simulation(
        capacity_milli=capacity,
        cards=len(ledger.gpus),
        classes=list(classes),
        namespaces=list(namespaces),
        job_class=job_class,
        job_namespace=job_ns,
        job_milli=job_milli,
        arrival=arrival,
        start=start,
        runtime=runtime,
        window=(clock.t0, clock.t1),
        buckets=[100.0 * b / (clock.width * capacity) for b in clock.buckets],
        mean_allocated_pct=100.0 * clock.mean("alloc") / capacity,
        mean_cards_in_use=clock.mean("cards"),
        mean_lower_bound_cards=clock.mean("bound"),
        mean_waiting=clock.mean("waiting"),
        idle_while_waiting_pct=100.0 * clock.mean("idle_waiting") / capacity,
        stranded_pct=100.0 * stranded_sum / stranded_samples / capacity if stranded_samples else 0.0,
        stranded_samples=stranded_samples,
        events=events,
        seconds=time.perf_counter() - started,
        expired_reservations=expired_total,
        backfilled=backfilled,
        still_waiting=still,
        placements=placements,
        gangs=sum(1 for m in members if len(m) > 1),
    )
