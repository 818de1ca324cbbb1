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
from packing.admission.worst_first import FRONT_SHARE, HOLD_IDLE, HOLD_SHARE, HOLD_WITHIN, MAX_CLOCK, WorstFirst
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
           "WorstFirst", "make_strategy"]


def make_strategy(name: str, max_drain_targets: int | None = None, drain_horizon: float | None = None,
                  hold_clock: float | None = None, hold_share: int | None = None,
                  hold_within: float | None = None, front_share: int | None = None,
                  hold_idle: float | None = None) -> Strategy:
    """A fresh strategy object of that name (QueueError for an unknown name); ``max_drain_targets``
    caps the drain targets (claims holding one under the aging guard, GPUs they take under
    drain-soonest and worst-first), ``drain_horizon`` is drain-soonest's and worst-first's horizon in
    seconds; ``hold_clock`` (seconds) and ``hold_share`` are worst-first's ceiling of the multi-card hold
    clock and its one-GPU-in-N cap on targets, ``hold_within`` its R (inf: a front holds at once) and
    ``front_share`` its one-GPU-in-N cap on the front's held targets, ``hold_idle`` its K (inf: no limit by
    the hold clock) (None: the strategy's default)."""
    if (hold_clock is not None or hold_share is not None or hold_within is not None
            or front_share is not None or hold_idle is not None) and name != WORST_FIRST:
        raise QueueError(f"a hold clock, share, within, front and idle are worst-first's settings, not {name}'s")
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
                          max_clock=MAX_CLOCK if hold_clock is None else hold_clock,
                          hold_share=HOLD_SHARE if hold_share is None else hold_share,
                          hold_within=HOLD_WITHIN if hold_within is None else hold_within,
                          front_share=FRONT_SHARE if front_share is None else front_share,
                          hold_idle=HOLD_IDLE if hold_idle is None else hold_idle)
    raise QueueError(f"unknown admission policy {name!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
