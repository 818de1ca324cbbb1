"""The claim queue's plain data: a waiting claim, an admission, the admission policies' names and the errors.

Kept apart from ``packing.queue`` (the queue itself) and ``packing.explain`` (why a claim waits), which
both use them; ``packing.queue`` re-exports every public name here.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import TypeGuard

from packing.entitlements import product_name
from packing.ledger import Allocation
from packing.products import Request

AGING_GUARD = "aging-guard"
BEST_EFFORT_FIFO = "best-effort-fifo"
STRICT_FIFO = "strict-fifo"
DRAIN_SOONEST = "drain-soonest"
WORST_FIRST = "worst-first"
ADMISSION_POLICIES = (WORST_FIRST, DRAIN_SOONEST, AGING_GUARD, BEST_EFFORT_FIFO, STRICT_FIFO)  # the default first
DEFAULT_ADMISSION = WORST_FIRST
DEFAULT_DRAIN_TARGETS = 8  # the reference study's best variant; also capped at a quarter of the nodes
DEFAULT_AGE_LIMIT = 3600.0  # seconds: the protocol B study's T, 2-4 points of capacity at saturation


class QueueError(ValueError):
    """A queue operation refused; the queue and the ledger are unchanged."""


@dataclass(frozen=True, slots=True)
class MemberOf:
    """A claim's pod group (a gang): its ``name`` (unique within the namespace) and the ``size`` its
    member declared. The group starts all together or not at all (``packing.group_book``)."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise QueueError("a pod group needs a non-empty name")
        if not whole(self.size) or self.size < 1:
            raise QueueError(f"pod group {self.name}: size must be a whole number >= 1, got {self.size!r}")


class UnknownClaimError(QueueError, KeyError):
    """The queue knows no such claim (neither waiting nor running)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown claim"


@dataclass(frozen=True, slots=True)
class WaitingClaim:
    """A claim asking for a slice. Keywords after ``request``: ``arrived_at`` (required), ``priority``
    (higher goes first), ``time_limit`` (declared, enforced maximum runtime in seconds) and ``group``
    (its pod group, when it is one of a gang). Where its pod may go travels with what it asks for:
    ``request.constraints`` (``packing.node_fit``)."""

    claim: str
    namespace: str
    request: Request
    _: KW_ONLY
    arrived_at: float
    priority: int = 0
    time_limit: float | None = None
    group: MemberOf | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.claim, str) or not self.claim:
            raise QueueError("a waiting claim needs a non-empty claim id")
        if not isinstance(self.namespace, str):
            raise QueueError(f"claim {self.claim}: namespace must be a string")
        if not isinstance(self.request, Request):
            raise QueueError(f"claim {self.claim}: request must be a packing.products.Request")
        if not finite(self.arrived_at):
            raise QueueError(f"claim {self.claim}: arrived_at must be a finite number, got {self.arrived_at!r}")
        if not whole(self.priority):
            raise QueueError(f"claim {self.claim}: priority must be an integer, got {self.priority!r}")
        if self.time_limit is not None and not (finite(self.time_limit) and self.time_limit > 0):
            raise QueueError(f"claim {self.claim}: time_limit must be a positive number of seconds or None")
        if self.group is not None and not isinstance(self.group, MemberOf):
            raise QueueError(f"claim {self.claim}: group must be a packing.claims.MemberOf or None")

    @property
    def product(self) -> str:
        """The product it is counted under (entitlements, age limits, positions)."""
        return product_name(self.request)


@dataclass(frozen=True, slots=True)
class Admission:
    """A claim the step admitted: its ledger allocation (a reservation when the queue has a TTL)."""

    claim: str
    allocation: Allocation
    waited: float
    namespace: str = ""
    backfill: bool = False  # admitted behind a starving head because it ends before the head can start


def real(value: object) -> TypeGuard[float]:
    """Is ``value`` a real (not bool) number, infinities included, NaN not?"""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def whole(value: object) -> TypeGuard[int]:
    """Is ``value`` an integer (not bool)?"""
    return isinstance(value, int) and not isinstance(value, bool)


def finite(value: object) -> bool:
    """Is ``value`` a real (not bool) finite number?"""
    return real(value) and math.isfinite(value)
