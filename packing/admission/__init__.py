"""Admission strategies: who of the waiting claims starts in one admission step. One module each,
in the manner of Kueue's ``cluster_queue_best_effort_fifo.go`` / ``cluster_queue_strict_fifo.go``:

* ``best_effort_fifo``: admit every claim that fits, in queue order;
* ``strict_fifo``: stop at the first claim that does not fit;
* ``aging_guard``: best effort, and a starving claim holds a node until it drains for it.

Each is ``step(view) -> admissions`` over an ``AdmissionView`` (``packing.admission.view``), with
its guarantee in its module docstring and its own tests (``tests/unit/test_queue_<name>.py``).
"""

from __future__ import annotations

from packing.admission.aging_guard import AgingGuard
from packing.admission.best_effort_fifo import BestEffortFifo
from packing.admission.strict_fifo import StrictFifo
from packing.admission.view import AdmissionView, Strategy
from packing.claims import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DEFAULT_DRAIN_TARGETS,
    STRICT_FIFO,
    QueueError,
)

__all__ = ["AdmissionView", "AgingGuard", "BestEffortFifo", "Strategy", "StrictFifo", "make_strategy"]


def make_strategy(name: str, max_drain_targets: int = DEFAULT_DRAIN_TARGETS) -> Strategy:
    """A fresh strategy object of that name (QueueError for an unknown name)."""
    if name == BEST_EFFORT_FIFO:
        return BestEffortFifo()
    if name == STRICT_FIFO:
        return StrictFifo()
    if name == AGING_GUARD:
        return AgingGuard(max_drain_targets)
    raise QueueError(f"unknown admission policy {name!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
