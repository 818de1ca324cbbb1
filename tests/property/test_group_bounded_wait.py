"""Pod groups keep the drain-soonest wait bound, checked against the simulation engine (hypothesis).

The bound (``packing/QUEUE.md``, *Pod groups*): in one priority level, on a fixed cluster, without
entitlements or reservations, when every claim declares an enforced limit of at most L, a unit --
a claim, or a complete pod group counted once -- that starts starving at s = arrival + T starts by
s + (A + 1) * L, A counting the units ahead of it in starving order still waiting at s. A k-card
job runs as a group of k one-card pods (``EngineConfig.gang``), so a large group among a stream of
small claims is a unit like any other: it is never starved.

Every run also checks what the engine asserts on each step: a group's members all start in the
same step (never part of one), and every job starts (no two groups deadlock).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from packing.products import load_catalog
from packing.queue import BEST_EFFORT_FIFO, DRAIN_SOONEST
from simulations.cluster import build_ledger, card_model_for
from simulations.engine import NEVER, EngineConfig, Simulation, simulate
from simulations.traces import Job, NodeSpec
from simulations.workload import job_request
from tests.property.test_queue_bounded_wait import violations

CATALOG = load_catalog()
CARD = card_model_for(CATALOG, "slices")
PRODUCTS = ("v100-25", "v100-50", "v100-100")


def run(nodes: list[int], jobs: list[Job], admission: str, limits: dict[str, float], seed: int = 0) -> Simulation:
    specs = [NodeSpec(f"n{i}", 64000, 262144, n, "Tesla-V100-SXM2-32GB") for i, n in enumerate(nodes)]
    ledger = build_ledger(specs, CARD, seed=seed, track_host=False)
    requests = [job_request(j, CATALOG, "slices") for j in jobs]
    config = EngineConfig(admission=admission, declare_limits=True, age_limits=tuple(limits.items()),
                          age_limit_s=3600.0, gang=True)
    return simulate(ledger, jobs, requests, config, seed)


job = st.tuples(st.floats(0, 3000), st.floats(1, 900), st.sampled_from((*PRODUCTS, "v100-25", "v100-100")),
                st.integers(1, 5))


@settings(max_examples=80, deadline=None)
@given(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3), raw=st.lists(job, min_size=1, max_size=40),
       limits=st.fixed_dictionaries({p: st.sampled_from([0.0, 60.0, 600.0]) for p in PRODUCTS}),
       seed=st.integers(0, 3))
def test_groups_and_claims_start_within_the_drain_soonest_bound(
        nodes: list[int], raw: list[tuple[float, float, str, int]], limits: dict[str, float], seed: int) -> None:
    cards = sum(nodes)  # a group of k one-card pods needs k cards anywhere, not on one node
    jobs = sorted((Job(f"j{k}", a, d, 0, count=min(c, cards) if p == "v100-100" else 1, product=p)
                   for k, (a, d, p, c) in enumerate(raw)), key=lambda j: j.arrival)
    sim = run(nodes, jobs, DRAIN_SOONEST, limits, seed)
    assert sim.still_waiting == 0  # no deadlock: every group and claim started
    assert all(s != NEVER for s in sim.start)
    assert violations(sim, jobs, limits) == []


def group_among_quarters(cards: int) -> list[Job]:
    """Quarters that keep every card busy (as in ``test_queue_bounded_wait.quarter_stream``), and a group
    of every card arriving among them."""
    jobs = [Job(f"q{k}", 100.0 * k / cards, 400.0, 0, product="v100-25") for k in range(60 * cards)]
    jobs.append(Job("group", 455.0, 100.0, 0, count=cards, product="v100-100"))
    return sorted(jobs, key=lambda j: j.arrival)


@settings(max_examples=6, deadline=None)
@given(cards=st.integers(2, 4))
def test_best_effort_starves_a_group_that_drain_soonest_starts_within_the_bound(cards: int) -> None:
    limits = {"v100-100": 0.0, "v100-25": 0.0, "v100-50": 0.0}
    jobs = group_among_quarters(cards)
    group = next(i for i, j in enumerate(jobs) if j.name == "group")
    best_effort = run([cards], jobs, BEST_EFFORT_FIFO, limits)
    assert any(v.startswith("group ") for v in violations(best_effort, jobs, limits))
    drain = run([cards], jobs, DRAIN_SOONEST, limits)
    assert violations(drain, jobs, limits) == []
    assert drain.start[group] <= 455.0 + 400.0
    assert drain.gangs == 1
