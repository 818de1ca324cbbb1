"""``strict-fifo`` (``packing.admission.strict_fifo``): nothing starts behind a claim that does not fit."""

from __future__ import annotations

from packing.entitlements import Entitlement
from packing.queue import BLOCKED_BY_HEAD_OF_LINE, NO_CAPACITY, STRICT_FIFO
from tests.unit.queue_helpers import Q, W, blocked_whole_card, by_claim, claim, ledger_with, queue


def test_strict_fifo_blocks_everything_behind_a_head_that_does_not_fit() -> None:
    q, _ = blocked_whole_card(STRICT_FIFO)
    assert q.admit(3) == []
    why = by_claim(q, 3)
    assert why["whole"].reason == NO_CAPACITY
    assert why["quarter"].reason == BLOCKED_BY_HEAD_OF_LINE
    assert "strict FIFO keeps it behind whole (v100-100)" in why["quarter"].message
    q.depart("running", 4)
    assert [a.claim for a in q.admit(4)] == ["whole"]


def test_strict_fifo_ignores_quota_blocked_claims() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, STRICT_FIFO)
    q.set_entitlement("capped", Entitlement({"v100-100": 0}))
    q.arrive(claim("capped", W, at=0, ns="capped"))
    q.arrive(claim("q", Q, at=1))
    assert [a.claim for a in q.admit(2)] == ["q"]
