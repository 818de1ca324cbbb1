"""``best-effort-fifo`` (``packing.admission.best_effort_fifo``): every claim that fits is admitted, in queue order."""

from __future__ import annotations

from packing.queue import BEST_EFFORT_FIFO, NO_CAPACITY
from tests.unit.queue_helpers import T, blocked_whole_card, reasons


def test_best_effort_lets_a_fitting_claim_pass_a_head_that_does_not_fit() -> None:
    q, _ = blocked_whole_card(BEST_EFFORT_FIFO)
    assert [a.claim for a in q.admit(T * 10)] == ["quarter"]
    assert reasons(q, T * 10) == {"whole": NO_CAPACITY}
