"""The wait bounds of drain-soonest and worst-first (the default), checked against the simulation engine
(hypothesis).

The bound (``packing/QUEUE.md``, *The drain-soonest bound*): in one priority level, on a fixed
cluster, without entitlements or reservations, when every claim declares an enforced time limit of
at most L, a claim c that starts starving at s_c = arrival + T(product) starts by
s_c + (A_c + 1) * L, where A_c counts the claims ahead of c in starving order (s, then arrival)
that still wait at s_c.

The worst-first bound (``packing/QUEUE.md``, *The worst-first bound*), every product alike: a claim c
starts by arrival_c + D_c + (A_c + 1) * L, where D_c is 0 when no claim of several cards (c included)
arrived by arrival_c and waits then, else max(``MAX_CLOCK``, L / ``HOLD_WITHIN``), and A_c counts the claims
ahead of c in queue order still waiting at arrival_c + D_c.

Random clusters and workloads run through ``simulations.engine.simulate`` -- the discrete-event
engine that drives ``ClaimQueue`` exactly as the extender does -- and every job's start is held to
the bound computed from the outcome alone. A stream of quarter slices shows the check can fail:
best effort breaks the bound there, drain-soonest and worst-first keep it.
"""

from __future__ import annotations

import functools
import math
import random
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.admission.worst_first import HOLD_WITHIN, MAX_CLOCK, WorstFirstSettings
from packing.products import load_catalog
from packing.queue import BEST_EFFORT_FIFO, DRAIN_SOONEST, WORST_FIRST
from packing.wait_history import WaitHistory
from simulations.cluster import build_ledger, card_model_for
from simulations.engine import NEVER, EngineConfig, Simulation, simulate
from simulations.traces import Job, NodeSpec
from simulations.workload import job_request

CATALOG = load_catalog()
CARD = card_model_for(CATALOG, "slices")
PRODUCTS = ("v100-25", "v100-50", "v100-100")


def run(nodes: list[int], jobs: list[Job], admission: str, limits: dict[str, float] | None, cap: int | None,
        seed: int = 0, head_starts: dict[str, float] | None = None,
        worst_first: WorstFirstSettings | None = None) -> Simulation:
    """``jobs`` through the engine; ``limits`` None leaves the strategy its own aging clocks."""
    specs = [NodeSpec(f"n{i}", 64000, 262144, n, "Tesla-V100-SXM2-32GB") for i, n in enumerate(nodes)]
    ledger = build_ledger(specs, CARD, seed=seed, track_host=False)
    requests = [job_request(j, CATALOG, "slices") for j in jobs]
    config = EngineConfig(admission=admission, declare_limits=True, age_limits=tuple((limits or {}).items()),
                          age_limit_s=None if limits is None else 3600.0, max_drain_targets=cap,
                          head_starts=tuple((head_starts or {}).items()), worst_first=worst_first)
    return simulate(ledger, jobs, requests, config, seed)


def jobs_of(nodes: list[int], raw: list[tuple[float, float, str, int]], multi: bool = True) -> list[Job]:
    """The drawn jobs in arrival order; whole cards keep their count of 2 when ``multi`` and a node has 2 cards."""
    biggest = max(nodes)
    return sorted((Job(f"j{k}", a, d, 0, count=c if multi and p == "v100-100" and c <= biggest else 1, product=p)
                   for k, (a, d, p, c) in enumerate(raw)), key=lambda j: j.arrival)


def violations(sim: Simulation, jobs: list[Job], limits: dict[str, float]) -> list[str]:
    """Jobs that started later than the bound allows, with the figures."""
    L = max(j.duration or 0.0 for j in jobs)
    starve = [(j.arrival + limits.get(j.product or "", 3600.0), i) for i, j in enumerate(jobs)]
    out = []
    for i, (s_c, _) in enumerate(starve):
        start = sim.start[i]
        if start <= s_c:
            continue
        ahead = sum(1 for k, (s_d, _) in enumerate(starve) if (s_d, k) < (s_c, i) and sim.start[k] > s_c)
        bound = s_c + (ahead + 1) * L
        if start > bound + 1e-6:
            out.append(f"{jobs[i].name} ({jobs[i].product} x{jobs[i].count}) starved at {s_c:.0f}, "
                       f"{ahead} ahead, L {L:.0f}: started {start:.0f} > bound {bound:.0f}")
    return out


def worst_first_violations(sim: Simulation, jobs: list[Job], head_starts: dict[str, float] | None = None,
                           multi_holds: bool = True, delay: float | None = None) -> list[str]:
    """Jobs that started later than the worst-first bound allows (one priority level, queue order: arrival,
    less the product's head start, where given; ``delay`` is D where a claim of several cards waits, by default
    max(MAX_CLOCK, L / HOLD_WITHIN)).
    ``multi_holds`` False (``clock=never``): claims of several cards hold nothing and have no bound;
    single-GPU claims keep theirs with D = 0."""
    L = max(j.duration or 0.0 for j in jobs)
    ahead_of = head_starts or {}
    h = [ahead_of.get(j.product or "", 0.0) if j.count == 1 else 0.0 for j in jobs]
    key = [(j.arrival - h[i], i) for i, j in enumerate(jobs)]
    h_max = max([0.0, *ahead_of.values()])
    out = []
    for i, j in enumerate(jobs):
        if sim.start[i] <= j.arrival or (j.count > 1 and not multi_holds):
            continue
        shift = h_max - h[i]  # by arrival + shift, every claim ahead of j in queue order has arrived
        by = j.arrival + shift
        multi = multi_holds and any(d.count > 1 and (d.arrival, k) <= (by, i if shift == 0 else len(jobs))
                                    and sim.start[k] > by for k, d in enumerate(jobs))
        at = j.arrival + shift + ((max(MAX_CLOCK, L / HOLD_WITHIN) if delay is None else delay) if multi else 0.0)
        ahead = sum(1 for k in range(len(jobs)) if key[k] < key[i] and sim.start[k] > at)
        bound = at + (ahead + 1) * L
        if sim.start[i] > bound + 1e-6:
            out.append(f"{j.name} ({j.product} x{j.count}) arrived {j.arrival:.0f}, {ahead} ahead, L {L:.0f}: "
                       f"started {sim.start[i]:.0f} > bound {bound:.0f}")
    return out


job = st.tuples(st.floats(0, 3000), st.floats(1, 900), st.sampled_from((*PRODUCTS, "v100-25", "v100-100")),
                st.sampled_from([1, 1, 1, 2]))


@settings(max_examples=80, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       limits=st.fixed_dictionaries({p: st.sampled_from([0.0, 60.0, 600.0]) for p in PRODUCTS}),
       cap=st.one_of(st.none(), st.integers(1, 4)), seed=st.integers(0, 3))
def test_every_claim_starts_within_the_drain_soonest_bound(
        nodes: list[int], raw: list[tuple[float, float, str, int]], limits: dict[str, float], cap: int | None,
        seed: int) -> None:
    jobs = jobs_of(nodes, raw)
    sim = run(nodes, jobs, DRAIN_SOONEST, limits, cap, seed)
    assert sim.still_waiting == 0
    assert all(s != NEVER for s in sim.start)
    assert violations(sim, jobs, limits) == []


@settings(max_examples=80, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       cap=st.one_of(st.none(), st.integers(1, 4)), seed=st.integers(0, 3), multi=st.booleans())
def test_every_claim_starts_within_the_worst_first_bound(
        nodes: list[int], raw: list[tuple[float, float, str, int]], cap: int | None, seed: int, multi: bool) -> None:
    jobs = jobs_of(nodes, raw, multi)
    sim = run(nodes, jobs, WORST_FIRST, None, cap, seed)
    assert sim.still_waiting == 0
    assert all(s != NEVER for s in sim.start)
    assert worst_first_violations(sim, jobs) == []


# arrivals bunched within 10 min: claims of one shape wait together, so the front's shape has several heads
busy_job = st.tuples(st.floats(0, 600), st.floats(60, 900), st.sampled_from((*PRODUCTS, "v100-100", "v100-100")),
                     st.sampled_from([1, 1, 1, 2]))


@pytest.mark.parametrize("what_if", [
    WorstFirstSettings(hold_share=1, front_share=2),  # single=sure, the default: the share while ends are declared
    WorstFirstSettings(hold_share=1, front_share=2, single_front="own"),  # a front of one GPU its own target alone
    WorstFirstSettings(hold_share=1, front_share=2, single_front="share"),  # the share for it too
    WorstFirstSettings(hold_share=1, front_share=2, single_front="share", front_worst=True),  # and worst=on
], ids=["single=sure", "single=own", "single=share", "worst=on"])
@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(busy_job, min_size=10, max_size=40),
       seed=st.integers(0, 3), multi=st.booleans(), cap=st.integers(2, 6))
def test_the_fronts_share_settings_keep_the_worst_first_bound(
        what_if: WorstFirstSettings, nodes: list[int], raw: list[tuple[float, float, str, int]], seed: int,
        multi: bool, cap: int) -> None:
    """How much the front's shape holds: ``single=sure`` (the default: a front of one GPU its share while declared
    ends free its own target, else that target alone; a front of several cards its share), ``single=own`` (a front
    of one GPU its own target alone), ``single=share`` (the share for every front) and with it ``worst=on`` (the
    share only while the front's product's recent p99 is the longest). The front's own target always holds, so the
    bound is the same. A product's history speaks after 2 admissions here (20 in service),
    targets may take every GPU and the front's shape one in 2, and arrivals are bunched, so claims of the front's
    shape wait together and the gates open and shut within these short runs."""
    jobs = jobs_of(nodes, raw, multi)
    with patch("packing.running_book.WaitHistory", functools.partial(WaitHistory, min_seen=2)):
        sim = run(nodes, jobs, WORST_FIRST, None, cap, seed, worst_first=what_if)
    assert sim.still_waiting == 0
    assert all(s != NEVER for s in sim.start)
    assert worst_first_violations(sim, jobs) == []


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       seed=st.integers(0, 3))
def test_without_multi_card_holds_single_gpu_claims_keep_the_bound_with_no_delay(
        nodes: list[int], raw: list[tuple[float, float, str, int]], seed: int) -> None:
    """The what-if ``clock=never``: claims of several cards never head, so none delays a single-GPU claim (D = 0)."""
    jobs = jobs_of(nodes, raw)
    sim = run(nodes, jobs, WORST_FIRST, None, None, seed, worst_first=WorstFirstSettings(hold_clock=math.inf))
    assert sim.still_waiting == 0
    assert worst_first_violations(sim, jobs, multi_holds=False) == []


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       ahead=st.fixed_dictionaries({p: st.sampled_from([-900.0, -120.0, 0.0, 300.0, 1200.0]) for p in PRODUCTS}),
       seed=st.integers(0, 3), multi=st.booleans())
def test_head_starts_shift_the_worst_first_bound_by_their_spread(
        nodes: list[int], raw: list[tuple[float, float, str, int]], ahead: dict[str, float], seed: int,
        multi: bool) -> None:
    """The what-if ``ahead.KIND``: c starts by arrival_c + (H_max - H_c) + D_c + (A_c + 1) L, A_c in the new order."""
    jobs = jobs_of(nodes, raw, multi)
    sim = run(nodes, jobs, WORST_FIRST, None, None, seed, head_starts=ahead)
    assert sim.still_waiting == 0
    assert all(s != NEVER for s in sim.start)
    assert worst_first_violations(sim, jobs, ahead) == []


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       within=st.sampled_from([0.5, 1.0, 2.0]), seed=st.integers(0, 3))
def test_within_delays_the_worst_first_bound_by_at_most_l_over_r(
        nodes: list[int], raw: list[tuple[float, float, str, int]], within: float, seed: int) -> None:
    """The what-if ``within=R`` (a multi-card front held once a target likely frees within R x its wait), with
    the hold clock's ceiling at 60 s so that L / R, not the clock, is D: D = max(60 s, L / R). From
    arrival_c + D every claim of several cards ahead of c has waited L / R, and every declared end is within
    L, so a front's target frees within R x its wait and is held as before."""
    jobs = jobs_of(nodes, raw)
    sim = run(nodes, jobs, WORST_FIRST, None, None, seed,
              worst_first=WorstFirstSettings(hold_clock=60.0, hold_within=within))
    assert sim.still_waiting == 0
    assert all(s != NEVER for s in sim.start)
    L = max(j.duration or 0.0 for j in jobs)
    assert worst_first_violations(sim, jobs, delay=max(60.0, L / within)) == []


@pytest.mark.parametrize("within", [0.25, 0.5, 1.0])
def test_within_needs_its_l_over_r_in_the_bound(within: float) -> None:
    """Quarters of 40 min keep two cards busy and a pair arrives among them: its target steers until it likely
    frees within R x the pair's wait, so the pair starts later than the bound with the clock alone as D, and
    within the bound with D = max(clock, L / R). (The property above cannot show it: its runs are shorter
    than the 30 min horizon, within which any target likely frees.)"""
    jobs = sorted([*(Job(f"q{k}", 300.0 * k, 2400.0, 0, product="v100-25") for k in range(60)),
                   Job("pair", 2455.0, 100.0, 0, count=2, product="v100-100")], key=lambda j: j.arrival)
    sim = run([2], jobs, WORST_FIRST, None, None, worst_first=WorstFirstSettings(hold_clock=60.0, hold_within=within))
    held_at_once = run([2], jobs, WORST_FIRST, None, None,
                       worst_first=WorstFirstSettings(hold_clock=60.0, hold_within=math.inf))
    pair = next(i for i, j in enumerate(jobs) if j.name == "pair")
    assert sim.start[pair] > held_at_once.start[pair]  # it steered a while
    assert [v for v in worst_first_violations(sim, jobs, delay=60.0) if v.startswith("pair ")]
    assert worst_first_violations(sim, jobs, delay=max(60.0, 2400.0 / within)) == []


def test_the_worst_first_bound_is_met_by_waiting_claims_of_every_product() -> None:
    """The bound is for every product: drawn as the property above draws them (fixed seeds), workloads in
    which quarters, halves, whole cards and claims of two cards all wait, and each of those waits is held
    to the bound -- so no product is covered only by claims that started at once."""
    waited: set[tuple[str | None, int]] = set()
    for seed in range(12):
        rng = random.Random(seed)
        nodes = [rng.randint(2, 4) for _ in range(rng.randint(1, 2))]
        jobs = sorted((Job(f"j{k}", rng.uniform(0, 3000), rng.uniform(60, 900), 0,
                           count=2 if p == "v100-100" and rng.random() < 0.3 else 1, product=p)
                       for k, p in enumerate(rng.choice((*PRODUCTS, "v100-25", "v100-100")) for _ in range(40))),
                      key=lambda j: j.arrival)
        sim = run(nodes, jobs, WORST_FIRST, None, None, seed)
        assert sim.still_waiting == 0 and worst_first_violations(sim, jobs) == []
        waited |= {(j.product, j.count) for i, j in enumerate(jobs) if sim.start[i] > j.arrival}
    assert waited >= {("v100-25", 1), ("v100-50", 1), ("v100-100", 1), ("v100-100", 2)}, waited


def quarter_stream(cards: int) -> list[Job]:
    """Quarters that keep every card busy (each runs 400 s, one arrives every 100 s per card, so a
    departing quarter's slot goes to the next at once), and a whole card arriving among them."""
    jobs = [Job(f"q{k}", 100.0 * k / cards, 400.0, 0, product="v100-25") for k in range(60 * cards)]
    jobs.append(Job("whole", 455.0, 100.0, 0, product="v100-100"))  # every card busy by then
    return sorted(jobs, key=lambda j: j.arrival)


@settings(max_examples=6, deadline=None)
@given(cards=st.integers(1, 3))
def test_best_effort_breaks_the_bound_that_drain_soonest_and_worst_first_keep(cards: int) -> None:
    limits = {"v100-100": 0.0, "v100-25": 0.0}
    jobs = quarter_stream(cards)
    best_effort = run([cards], jobs, BEST_EFFORT_FIFO, limits, None)
    assert any(v.startswith("whole ") for v in violations(best_effort, jobs, limits))
    drain = run([cards], jobs, DRAIN_SOONEST, limits, None)
    assert violations(drain, jobs, limits) == []
    whole = next(i for i, j in enumerate(jobs) if j.name == "whole")
    assert drain.start[whole] <= 455.0 + 400.0
    assert any(v.startswith("whole ") for v in worst_first_violations(best_effort, jobs))
    worst = run([cards], jobs, WORST_FIRST, None, None)
    assert worst_first_violations(worst, jobs) == []
    assert worst.start[whole] <= 455.0 + 400.0
