"""Shared helpers of the queue's unit tests: small ledgers, claims and a queue under one strategy."""

from __future__ import annotations

from packing.ledger import Ledger
from packing.products import Catalog, Request, load_catalog
from packing.queue import AGING_GUARD, ClaimQueue, Explanation, WaitingClaim

V100 = "Tesla-V100-SXM2-32GB"
T4 = "Tesla-T4"
CATALOG: Catalog = load_catalog()
Q = CATALOG.request("v100-25")
H = CATALOG.request("v100-50")
W = CATALOG.request("v100-100")
W2 = CATALOG.request("v100-100", count=2)
T = 600.0  # the age limit used where a test needs the guard


def ledger_with(*shape: int, model: str = V100) -> Ledger:
    """Nodes n0, n1, ... with ``shape[i]`` cards each."""
    ledger = Ledger()
    for i, n in enumerate(shape):
        ledger.add_node(f"n{i}", [(f"n{i}-gpu{j}", model, 32768) for j in range(n)])
    return ledger


def claim(name: str, request: Request, at: float, ns: str = "team", priority: int = 0,
          limit: float | None = None) -> WaitingClaim:
    return WaitingClaim(name, ns, request, arrived_at=at, priority=priority, time_limit=limit)


def queue(ledger: Ledger, admission: str = AGING_GUARD, **kwargs: object) -> ClaimQueue:
    kwargs.setdefault("default_age_limit", T)
    return ClaimQueue(ledger, admission=admission, **kwargs)  # type: ignore[arg-type]


def reasons(q: ClaimQueue, now: float) -> dict[str, str]:
    return {e.claim: e.reason for e in q.explain(now)}


def by_claim(q: ClaimQueue, now: float) -> dict[str, Explanation]:
    return {e.claim: e for e in q.explain(now)}


def fill(q: ClaimQueue, ledger: Ledger, names: list[tuple[str, Request]], now: float = 0.0,
         limit: float | None = None) -> None:
    """Admit ``names`` right away (they must fit), as running claims."""
    for name, r in names:
        q.arrive(claim(name, r, now, ns="filler", limit=limit))
    admitted = {a.claim for a in q.admit(now)}
    assert admitted == {n for n, _ in names}


def checked(q: ClaimQueue) -> None:
    q.verify()
    q.ledger.verify()


def blocked_whole_card(admission: str) -> tuple[ClaimQueue, Ledger]:
    """One card, a quarter running, a whole card waiting ahead of a quarter."""
    ledger = ledger_with(1)
    q = queue(ledger, admission)
    fill(q, ledger, [("running", Q)])
    q.arrive(claim("whole", W, at=1))
    q.arrive(claim("quarter", Q, at=2))
    return q, ledger
