"""The discrete-event engine over the real queue and ledger: stranding, order, conservation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.products import load_catalog
from packing.queue import STRICT_FIFO
from simulations.cluster import CardModel, TrackedLedger, build_ledger, card_nodes
from simulations.engine import NEVER, EngineConfig, EngineError, simulate
from simulations.metrics import percentile, summary, waits_by_class
from simulations.traces import Job, NodeSpec
from simulations.workload import job_request

CATALOG = load_catalog()
LABEL = "Tesla-V100-SXM2-32GB"
CARD = CardModel(LABEL, 32768)


def cluster(cards: int, per_node: int = 8, seed: int = 0) -> TrackedLedger:
    return build_ledger(card_nodes(cards, per_node=per_node), CARD, seed=seed, track_host=False)


def job(name: str, at: float, runtime: float, product: str, count: int = 1, priority: int = 0) -> Job:
    return Job(name, at, runtime, 0, count=count, product=product, priority=priority)


def requests(jobs: list[Job]) -> list:  # type: ignore[type-arg]
    return [job_request(j, CATALOG, "slices") for j in jobs]


def test_five_events_strand_a_whole_card() -> None:
    """notes §4: ¼ then ½ on card 0, ½ on card 1, the ¼ leaves: ½ + ½ free, a whole card waits."""
    ledger = build_ledger([NodeSpec("n", 0, 0, 2, LABEL)], CARD, track_host=False)
    jobs = [job("q", 0, 3.5, "v100-25"), job("h1", 1, 100, "v100-50"), job("h2", 2, 200, "v100-50"),
            job("w", 4, 10, "v100-100")]
    sim = simulate(ledger, jobs, requests(jobs), EngineConfig(policy="best-fit"), seed=0)
    assert list(sim.start) == [0.0, 1.0, 2.0, 101.0]  # the whole card starts only when h1 leaves
    assert sim.stranded_pct > 0  # while it waited, half of the cluster was free but useless to it
    assert not ledger.allocations
    ledger.verify()


def random_jobs(n: int, seed: int) -> list[Job]:
    import random

    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 20)
        product = rng.choice(["v100-25", "v100-50", "v100-100", "v100-100"])
        count = 2 if product == "v100-100" and rng.random() < 0.1 else 1
        out.append(job(f"j{i}", t, rng.choice([30.0, 120.0, 600.0]), product, count, rng.choice([0, 0, 5])))
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 1000), admission=st.sampled_from(["aging-guard", "best-effort-fifo", "strict-fifo"]),
       policy=st.sampled_from(["best-fit", "spread", "frag-gradient"]), ties=st.sampled_from(["stable", "random"]))
def test_every_job_starts_once_after_it_arrives_and_capacity_is_returned(
        seed: int, admission: str, policy: str, ties: str) -> None:
    from simulations.scheduler import SchedulerModel

    ledger = cluster(8, per_node=4, seed=seed)
    jobs = random_jobs(120, seed)
    config = EngineConfig(policy=policy, admission=admission, model=SchedulerModel(ties=ties), age_limit_s=300)
    sim = simulate(ledger, jobs, requests(jobs), config, seed=seed)
    assert all(s != NEVER and s >= a for a, s in zip(sim.arrival, sim.start, strict=True))
    assert sim.events == 2 * len(jobs) and sim.still_waiting == 0
    assert not ledger.allocations  # every departure released its slice
    ledger.verify()
    assert 0 <= sim.mean_allocated_pct <= 100
    assert sim.mean_lower_bound_cards <= sim.mean_cards_in_use + 1e-9
    again = simulate(cluster(8, per_node=4, seed=seed), jobs, requests(jobs), config, seed=seed)
    assert list(again.start) == list(sim.start)  # deterministic for a seed


def test_strict_fifo_starts_equal_priorities_in_arrival_order() -> None:
    jobs = [j if j.priority == 0 else Job(j.name, j.arrival, j.duration, 0, j.count, product=j.product)
            for j in random_jobs(150, 3)]
    sim = simulate(cluster(4, per_node=4), jobs, requests(jobs), EngineConfig(admission=STRICT_FIFO), seed=1)
    starts = list(sim.start)
    assert starts == sorted(starts)


def test_lapsed_reservations_go_back_in_line_and_still_start() -> None:
    jobs = random_jobs(80, 9)
    config = EngineConfig(reservation_ttl_s=5.0, bind_delay_s=10.0)  # most binds come after the TTL
    ledger = cluster(8, per_node=4)
    sim = simulate(ledger, jobs, requests(jobs), config, seed=4)
    assert sim.expired_reservations > 0
    assert sim.still_waiting == 0 and not ledger.allocations
    ledger.verify()


def test_utilisation_and_the_lower_bound_are_time_weighted() -> None:
    jobs = [job("a", 0, 100, "v100-50"), job("b", 100, 10, "v100-25")]
    sim = simulate(cluster(2, per_node=2), jobs, requests(jobs), EngineConfig(sample_points=4), seed=0)
    assert sim.window == (0.0, 100.0)
    assert sim.mean_allocated_pct == pytest.approx(25.0)
    assert sim.buckets == pytest.approx([25.0] * 4)
    assert sim.mean_cards_in_use == pytest.approx(1.0) and sim.mean_lower_bound_cards == pytest.approx(1.0)
    s = summary(sim)
    assert s["offered_load"] == pytest.approx((500 * 100 + 250 * 10) / (2000 * 100))


def test_waits_by_class_and_percentiles() -> None:
    jobs = [job("a", 0, 100, "v100-100"), job("b", 0, 100, "v100-100"), job("c", 10, 5, "v100-25")]
    sim = simulate(build_ledger([NodeSpec("n", 0, 0, 1, LABEL)], CARD, track_host=False), jobs, requests(jobs),
                   EngineConfig(admission="best-effort-fifo"), seed=0)
    waits = waits_by_class(sim)
    assert waits["v100-100"].max_s == 100.0 and waits["v100-100"].p50_s == 50.0
    assert waits["v100-25"].p50_s == 190.0  # the quarter waits behind both whole cards
    assert waits["all"].jobs == 3
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 99) == 5.0


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(EngineError, match="reservation TTL"):
        EngineConfig(bind_delay_s=1.0)
    with pytest.raises(EngineError, match="no jobs"):
        simulate(cluster(1), [], [], EngineConfig(), seed=0)
    jobs = [job("a", 5, 1, "v100-25"), job("b", 1, 1, "v100-25")]
    with pytest.raises(EngineError, match="sorted"):
        simulate(cluster(1), jobs, requests(jobs), EngineConfig(), seed=0)
