"""The queue under node constraints, on random clusters and workloads (hypothesis), every strategy:

* every admission lands on a node the claim's pod may use (labels, taints, cordon), and every drain
  target is such a node;
* best effort stays work-conserving within the allowed nodes: no claim waits ``NoCapacity`` while
  a node it may use has room for it;
* positions count exactly the claims ahead that compete for a node (overlapping allowed sets,
  recomputed here node by node with ``may_run``).

Nodes change labels and cordons between steps, so the queue's memos (satisfiability, allowed sets)
are exercised across topology changes.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from packing.ledger import Ledger
from packing.node_fit import NO_SCHEDULE, NodeConstraints, Taint, Toleration, may_run
from packing.products import load_catalog
from packing.queue import ADMISSION_POLICIES, BEST_EFFORT_FIFO, NO_CAPACITY, ClaimQueue, WaitingClaim

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"
PRODUCTS = [CATALOG.request(p) for p in ("v100-25", "v100-50", "v100-100")]
CONSTRAINTS = [
    None,
    NodeConstraints(node_selector=(("pool", "a"),)),
    NodeConstraints(node_selector=(("pool", "b"),)),
    NodeConstraints(tolerations=(Toleration("gpu", "Exists"),)),
    NodeConstraints(node_selector=(("pool", "a"),),
                    tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists", "", NO_SCHEDULE),)),
]
TAINT = Taint("gpu", "", NO_SCHEDULE)

node_spec = st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.booleans())  # pool, tainted, cordoned
events = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 2), st.integers(0, len(CONSTRAINTS) - 1)),
    st.tuples(st.just("depart"), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("relabel"), st.integers(0, 3), st.integers(0, 7)),
), min_size=1, max_size=30)


def allowed(ledger: Ledger, c: NodeConstraints | None) -> set[str]:
    return {n.name for n in ledger.nodes.values() if may_run(c, n.name, n.facts)}


def check(q: ClaimQueue, admission: str, now: float) -> None:
    ledger = q.ledger
    for claim, node in q.drain_targets().items():
        assert node in allowed(ledger, q.claim(claim).request.constraints), f"drain target {node} off-limits"
    waiting = list(q.in_order())
    sets = [allowed(ledger, w.request.constraints) for w in waiting]
    for i, e in enumerate(q.explain(now)):
        assert e.claim == waiting[i].claim
        mine = sets[i]
        competing = sum(1 for j in range(i) if sets[j] & mine or sets[j] == mine)
        assert e.position == 1 + competing, (e, sets[: i + 1])
        same = sum(1 for j in range(i) if (sets[j] & mine or sets[j] == mine)
                   and waiting[j].product == waiting[i].product)
        assert e.product_position == 1 + same
        if admission == BEST_EFFORT_FIFO and e.reason == NO_CAPACITY:
            r = waiting[i].request
            assert not any(ledger.fits_on(ledger.nodes[n], r) for n in mine), f"{e.claim} waits with room"
    q.verify()
    ledger.verify()


@settings(max_examples=200, deadline=None)
@given(admission=st.sampled_from(ADMISSION_POLICIES), specs=st.lists(node_spec, min_size=1, max_size=4),
       script=events)
def test_admissions_respect_node_constraints(admission: str, specs: list[tuple[str, bool, bool]],
                                             script: list[tuple[str, int, int]]) -> None:
    ledger = Ledger()
    for i, (pool, tainted, cordoned) in enumerate(specs):
        ledger.add_node(f"n{i}", [(f"n{i}-g{j}", V100, 32768) for j in range(2)], labels={"pool": pool},
                        taints=(TAINT,) if tainted else (), unschedulable=cordoned)
    q = ClaimQueue(ledger, admission=admission, default_age_limit=30.0)
    now = 0.0
    seq = 0
    for kind, x, y in script:
        now += 10.0
        if kind == "arrive":
            seq += 1
            request = replace(PRODUCTS[x], constraints=CONSTRAINTS[y])
            q.arrive(WaitingClaim(f"c{seq}", "team", request, arrived_at=now))
        elif kind == "depart":
            running = sorted(a.claim for a in ledger.allocations.values())
            if running:
                q.depart(running[x % len(running)], now)
        else:
            name = f"n{x % len(specs)}"
            if name in ledger.nodes:
                ledger.set_facts(name, {"pool": "ab"[y & 1]}, (TAINT,) if y & 2 else (), bool(y & 4))
        for a in q.admit(now):
            node = ledger.nodes[a.allocation.node]
            assert may_run(a.allocation.request.constraints, node.name, node.facts), \
                f"{a.claim} admitted on {node.name}, a node its pod may not use"
        check(q, admission, now)
