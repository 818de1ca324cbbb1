"""Admission strategies: who of the waiting claims starts in one admission step. One module each,
in the manner of Kueue's ``cluster_queue_best_effort_fifo.go`` / ``cluster_queue_strict_fifo.go``:

* ``best_effort_fifo``: admit every claim that fits, in queue order;
* ``strict_fifo``: stop at the first claim that does not fit;
* ``aging_guard``: best effort, and a starving claim holds a node until it drains for it;
* ``drain_soonest``: starving claims first, each holding the GPUs that should free for it soonest.

Each is ``step(view) -> admissions`` over an ``AdmissionView`` (``packing.admission.view``), with
its guarantee in its module docstring and its own tests (``tests/unit/test_queue_<name>.py``).
"""

from __future__ import annotations

from packing.admission.aging_guard import AgingGuard
from packing.admission.best_effort_fifo import BestEffortFifo
from packing.admission.drain_soonest import DEFAULT_HORIZON, DrainSoonest
from packing.admission.strict_fifo import StrictFifo
from packing.admission.view import AdmissionView, Strategy
from packing.admission.worst_first import WorstFirst, WorstFirstSettings
from packing.claims import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DEFAULT_DRAIN_TARGETS,
    DRAIN_SOONEST,
    STRICT_FIFO,
    WORST_FIRST,
    QueueError,
)

__all__ = ["AdmissionView", "AgingGuard", "BestEffortFifo", "DrainSoonest", "Strategy", "StrictFifo",
           "WorstFirst", "WorstFirstSettings", "make_strategy"]


def make_strategy(name: str, max_drain_targets: int | None = None, drain_horizon: float | None = None,
                  worst_first: WorstFirstSettings | None = None) -> Strategy:
    """A fresh strategy object of that name (QueueError for an unknown name); ``max_drain_targets``
    caps the drain targets (claims holding one under the aging guard, GPUs they take under
    drain-soonest and worst-first), ``drain_horizon`` is drain-soonest's and worst-first's horizon in
    seconds; ``worst_first`` holds worst-first's settings (``WorstFirstSettings``: the ceiling of the
    multi-card hold clock, its one-GPU-in-N cap on targets, its R, its one-GPU-in-N cap on the front's
    held targets and its K), refused for any other strategy (None: the strategy's default)."""
    if worst_first is not None and name != WORST_FIRST:
        raise QueueError(f"a hold clock, share, within, front, idle and spare are worst-first's settings, not {name}'s")
    if name == BEST_EFFORT_FIFO:
        return BestEffortFifo()
    if name == STRICT_FIFO:
        return StrictFifo()
    if name == AGING_GUARD:
        return AgingGuard(max_drain_targets or DEFAULT_DRAIN_TARGETS)
    if name == DRAIN_SOONEST:
        return DrainSoonest(max_drain_targets, DEFAULT_HORIZON if drain_horizon is None else drain_horizon)
    if name == WORST_FIRST:
        return WorstFirst(max_drain_targets, DEFAULT_HORIZON if drain_horizon is None else drain_horizon,
                          settings=worst_first)
    raise QueueError(f"unknown admission policy {name!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
