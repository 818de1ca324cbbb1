"""``drain-soonest`` (``packing.admission.drain_soonest``): starving claims first, each head holding the
GPUs that should free up for it soonest; everything else best effort off those GPUs."""

from __future__ import annotations

from packing.admission import DrainSoonest
from packing.admission.holds import is_hold
from packing.estimate import RuntimeHistory
from packing.ledger import Ledger
from packing.queue import (
    ADMISSIBLE,
    BLOCKED_BY_HEAD_OF_LINE,
    DRAIN_SOONEST,
    NO_CAPACITY,
    WAITING_FOR_RESERVATION,
    ClaimQueue,
)
from tests.unit.queue_helpers import W2, H, Q, W, by_claim, checked, claim, ledger_with, reasons

LIMITS = {"v100-100": 0.0, "v100-25": 0.0}  # whole cards and quarters starve at once; halves after an hour


def drain_queue(ledger: Ledger, **kwargs: object) -> ClaimQueue:
    kwargs.setdefault("age_limits", LIMITS)
    kwargs.setdefault("default_age_limit", 3600.0)
    return ClaimQueue(ledger, admission=DRAIN_SOONEST, **kwargs)  # type: ignore[arg-type]


def run(q: ClaimQueue, ledger: Ledger, name: str, request: object, node: str, gpu: int,
        limit: float | None = None, at: float = 0.0) -> None:
    """``name`` already holds ``request`` on GPU ``gpu`` of ``node`` since ``at``."""
    ledger.assign(name, request, node, (f"{node}-gpu{gpu}",))  # type: ignore[arg-type]
    q.start(name, "filler", request, now=at, time_limit=limit)  # type: ignore[arg-type]


def gpus_of(q: ClaimQueue) -> dict[str, tuple[str, ...]]:
    assert isinstance(q.strategy, DrainSoonest)
    return {c: t.gpus for c, t in q.strategy.gpu_targets().items()}


def no_holds_left(ledger: Ledger) -> None:
    assert not [a for a in ledger.allocations if is_hold(a)], "a hold outlived its step"
    ledger.verify()


def test_a_starving_whole_card_holds_the_gpu_whose_declared_ends_come_first() -> None:
    ledger = ledger_with(2)
    q = drain_queue(ledger)
    run(q, ledger, "quarter-long", Q, "n0", 0, limit=1000.0)
    run(q, ledger, "half-long", H, "n0", 0, limit=1000.0)
    run(q, ledger, "half-short", H, "n0", 1, limit=500.0)
    q.arrive(claim("whole", W, at=0))
    assert q.admit(0) == []  # not starving yet: waited 0, not past 0
    assert q.admit(1) == [] and gpus_of(q) == {"whole": ("n0-gpu1",)}
    why = by_claim(q, 1)["whole"]
    assert why.reason == WAITING_FOR_RESERVATION and why.estimated_start == 500.0
    assert "holding GPU 1 of node n0 for it" in why.message and "by 8 min 19 s from now" in why.message
    no_holds_left(ledger)
    # a younger half fits only on the held GPU: it waits; a quarter goes on the other one
    q.arrive(claim("young-half", H, at=2))
    q.arrive(claim("young-quarter", Q, at=2))
    assert [(a.claim, a.allocation.gpus) for a in q.admit(2)] == [("young-quarter", ("n0-gpu0",))]
    why = by_claim(q, 2)["young-half"]
    assert why.reason == BLOCKED_BY_HEAD_OF_LINE and "fits only on GPU 1 of node n0, held for" in why.message
    q.depart("half-short", 500)
    assert [(a.claim, a.allocation.gpus) for a in q.admit(500)] == [("whole", ("n0-gpu1",))]
    assert q.drain_targets() == {} and reasons(q, 500) == {"young-half": NO_CAPACITY}
    no_holds_left(ledger)
    checked(q)


def test_starving_claims_go_first_whatever_their_arrival() -> None:
    ledger = ledger_with(1)
    q = drain_queue(ledger)
    run(q, ledger, "running", W, "n0", 0)
    q.arrive(claim("old-half", H, at=0))  # halves starve after an hour
    q.arrive(claim("young-whole", W, at=10))  # whole cards at once
    assert q.admit(20) == []
    q.depart("running", 30)
    assert [a.claim for a in q.admit(30)] == ["young-whole"]
    assert reasons(q, 30) == {"old-half": NO_CAPACITY}


def test_between_starving_claims_the_earliest_to_starve_goes_first() -> None:
    ledger = ledger_with(1)
    q = drain_queue(ledger, age_limits={"v100-100": 100.0, "v100-50": 0.0})
    run(q, ledger, "running", W, "n0", 0)
    q.arrive(claim("whole", W, at=0))  # starves at 100
    q.arrive(claim("half", H, at=50))  # arrived later, starved earlier (at 50)
    assert q.admit(200) == []
    assert gpus_of(q) == {"half": ("n0-gpu0",)}  # one GPU: the earliest to starve holds it
    q.depart("running", 300)
    assert [a.claim for a in q.admit(300)] == ["half"]


def test_the_heads_of_a_shape_share_its_targets_and_the_oldest_takes_the_first_that_frees() -> None:
    ledger = ledger_with(4)
    q = drain_queue(ledger, max_drain_targets=3)
    for g, limit in enumerate((400.0, 300.0, 200.0, 100.0)):
        run(q, ledger, f"run{g}", H, "n0", g, limit=limit)
        run(q, ledger, f"run{g}b", H, "n0", g, limit=limit)
    for i in range(3):
        q.arrive(claim(f"w{i}", W, at=i))
    assert q.admit(5) == []
    assert gpus_of(q) == {"w0": ("n0-gpu3",), "w1": ("n0-gpu2",), "w2": ("n0-gpu1",)}  # soonest first
    # gpu1 frees first by accident (its claims end early): the oldest head takes it
    q.depart("run1", 50)
    q.depart("run1b", 50)
    assert [(a.claim, a.allocation.gpus) for a in q.admit(50)] == [("w0", ("n0-gpu1",))]
    assert gpus_of(q) == {"w1": ("n0-gpu3",), "w2": ("n0-gpu2",)}  # the soonest left is shown for the oldest
    no_holds_left(ledger)
    checked(q)


def test_heads_are_capped_and_the_rest_of_the_cluster_stays_best_effort() -> None:
    ledger = ledger_with(4)
    q = drain_queue(ledger, max_drain_targets=1)
    for g in range(4):
        run(q, ledger, f"run{g}", H, "n0", g, limit=100.0 * (g + 1))
    q.arrive(claim("w0", W, at=0))
    q.arrive(claim("w1", W, at=1))
    q.arrive(claim("h", H, at=2))
    admitted = q.admit(5)
    assert gpus_of(q) == {"w0": ("n0-gpu0",)}
    assert [(a.claim, a.allocation.gpus) for a in admitted] == [("h", ("n0-gpu1",))]  # off the held GPU
    assert reasons(q, 5) == {"w0": WAITING_FOR_RESERVATION, "w1": NO_CAPACITY}


def test_a_claim_that_surely_ends_before_the_target_frees_backfills_it() -> None:
    ledger = ledger_with(1)
    q = drain_queue(ledger)
    run(q, ledger, "half", H, "n0", 0, limit=1000.0)
    q.arrive(claim("whole", W, at=0))
    q.arrive(claim("long", Q, at=1, limit=2000.0))
    q.arrive(claim("short", Q, at=2, limit=500.0))
    q.arrive(claim("undeclared", Q, at=3))
    assert reasons(q, 5)["short"] == ADMISSIBLE  # explain before any step: the target is not held yet
    admitted = q.admit(5)
    assert [(a.claim, a.backfill) for a in admitted] == [("short", True)]
    why = by_claim(q, 5)
    assert why["whole"].reason == WAITING_FOR_RESERVATION and why["whole"].estimated_start == 1000.0
    assert why["long"].reason == BLOCKED_BY_HEAD_OF_LINE and why["undeclared"].reason == BLOCKED_BY_HEAD_OF_LINE
    q.depart("short", 505)
    q.depart("half", 1000)
    assert [a.claim for a in q.admit(1000)] == ["whole"]
    checked(q)


def test_a_quarter_head_holds_the_gpu_where_a_quarter_frees_soonest() -> None:
    ledger = ledger_with(2)
    q = drain_queue(ledger)
    run(q, ledger, "w", W, "n0", 0, limit=100.0)  # a whole card ends first, but a quarter needs less
    for i in range(4):
        run(q, ledger, f"q{i}", Q, "n0", 1, limit=50.0 if i == 3 else 900.0)
    q.arrive(claim("quarter", Q, at=0))
    assert q.admit(1) == [] and gpus_of(q) == {"quarter": ("n0-gpu1",)}
    q.depart("q3", 50)
    assert [(a.claim, a.allocation.gpus) for a in q.admit(50)] == [("quarter", ("n0-gpu1",))]


def test_a_multi_card_head_holds_gpus_of_one_node() -> None:
    ledger = ledger_with(2, 2)
    q = drain_queue(ledger)
    run(q, ledger, "a", W, "n0", 0, limit=100.0)
    run(q, ledger, "b", W, "n1", 0, limit=50.0)
    run(q, ledger, "c", W, "n1", 1, limit=60.0)
    run(q, ledger, "d", W, "n0", 1, limit=500.0)
    q.arrive(claim("pair", W2, at=0))
    q.arrive(claim("single", W, at=1))
    assert q.admit(2) == []
    assert gpus_of(q)["pair"] == ("n1-gpu0", "n1-gpu1")  # n1 frees both by 60; n0 only by 500
    q.depart("b", 50)
    assert q.admit(50) == []  # the single card is younger: it may not take a GPU held for the pair
    q.depart("c", 60)
    assert [a.claim for a in q.admit(60)] == ["pair"]
    checked(q)


def test_without_declared_ends_the_youngest_claims_drain_first() -> None:
    ledger = ledger_with(2)
    q = drain_queue(ledger)
    run(q, ledger, "old", W, "n0", 0, at=0.0)
    run(q, ledger, "young", W, "n0", 1, at=3000.0)
    q.arrive(claim("whole", W, at=3000.0))
    assert q.admit(3600.0) == [] and gpus_of(q) == {"whole": ("n0-gpu1",)}
    assert by_claim(q, 3600.0)["whole"].estimated_start is None
    assert "unknown: the claims there declare no time limit" in by_claim(q, 3600.0)["whole"].message


def test_the_target_is_re_picked_when_its_node_leaves() -> None:
    ledger = ledger_with(1, 1)
    q = drain_queue(ledger)
    run(q, ledger, "a", H, "n0", 0, limit=100.0)
    run(q, ledger, "b", H, "n1", 0, limit=200.0)
    q.arrive(claim("whole", W, at=0))
    assert q.admit(1) == [] and gpus_of(q) == {"whole": ("n0-gpu0",)}
    ledger.remove_node("n0")
    q.depart("a", 2)  # the queue still tracks it; the node took its slice along
    assert q.admit(2) == [] and gpus_of(q) == {"whole": ("n1-gpu0",)}
    checked(q)


def test_default_aging_clocks_go_by_size() -> None:
    q = ClaimQueue(ledger_with(2), admission=DRAIN_SOONEST)
    assert [q.age_limit(r.product or "", r) for r in (W, Q, H, W2)] == [0.0, 0.0, 4 * 3600.0, 4 * 3600.0]
    assert ClaimQueue(ledger_with(1), admission=DRAIN_SOONEST, default_age_limit=60.0).age_limit("v100-100", W) == 60
    assert ClaimQueue(ledger_with(1), admission=DRAIN_SOONEST, age_limits={"v100-50": 5.0}).age_limit("v100-50", H) == 5


def test_runtime_history_learns_per_product_and_falls_back_on_the_tail_prior() -> None:
    h = RuntimeHistory(window=4, min_seen=2)
    assert h.ends_within("p", 0.0, 100.0) == 1.0 and h.ends_within("p", 100.0, 100.0) == 0.5  # prior h/(a+h)
    for r in (10.0, 20.0, 400.0, 800.0):
        h.add("p", r)
    assert h.seen("p") == 4
    assert h.ends_within("p", 0.0, 100.0) == 2 / 5  # of 4 seen, 2 end within 100; one unseen longer run
    assert h.ends_within("p", 300.0, 200.0) == 1 / 3
    assert h.ends_within("p", 900.0, 100.0) == 0.0
    h.add("p", 30.0)  # the window keeps the last four
    assert h.seen("p") == 4 and h.ends_within("p", 0.0, 100.0) == 2 / 5


def test_departures_feed_the_runtime_history() -> None:
    ledger = ledger_with(1)
    q = drain_queue(ledger)
    q.arrive(claim("a", Q, at=0))
    q.admit(0)
    q.depart("a", 120.0)
    assert q.view(200.0).book.history.seen("v100-25") == 1
