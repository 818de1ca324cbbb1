"""``strict-fifo``: in queue order, stop at the first claim within its entitlement that does not fit.

Guarantee: no claim is ever overtaken by one behind it in queue order (claims over their
entitlement, or that no node could hold, block nobody) -- also where they may use other nodes: a
claim pinned to a full pool holds up the whole line. Capacity idles behind the head of the line
(protocol B: every product waits as long as the head). Kueue's ``StrictFIFO``.

Cost: as best effort, and the step ends at the first claim that does not fit.
"""

from __future__ import annotations

from packing.admission.view import AdmissionView
from packing.claims import DEFAULT_AGE_LIMIT, STRICT_FIFO, Admission, WaitingClaim
from packing.explain import BLOCKED_BY_HEAD_OF_LINE, Lens
from packing.products import Request


class StrictFifo:
    """The strategy object (it keeps nothing between steps)."""

    name = STRICT_FIFO

    def step(self, view: AdmissionView) -> list[Admission]:
        out: list[Admission] = []
        walk = view.walk()
        while (item := walk.pop()) is not None:
            key, shape, cls = item
            if not view.satisfiable(shape.request):
                continue
            if view.over_entitlement(cls):
                walk.advance(shape, key)
                continue
            choice = view.choose(shape.request)
            if choice is None:
                return out  # the head of the line: nothing behind it starts
            out.append(view.admit(view.claim_at(key).claim, choice))
            walk.advance(shape, key)
        return out

    def lens(self, view: AdmissionView) -> Lens | None:
        return _HeadOfLine()

    def targets(self) -> dict[str, str]:
        return {}

    def default_age_limit(self, request: Request) -> float:
        return DEFAULT_AGE_LIMIT  # it does not age claims; the queue reports this T

    def group_age_limit(self, request: Request) -> float:
        return self.default_age_limit(request)


class _HeadOfLine:
    """Explain: every claim that fits behind the first one that does not is blocked by it."""

    def __init__(self) -> None:
        self.head: WaitingClaim | None = None
        self.blocked = ""

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        if self.head is not None and fit:
            return BLOCKED_BY_HEAD_OF_LINE, self.blocked, None
        if self.head is None and not fit:
            self.head = w
            self.blocked = f"fits now, but strict FIFO keeps it behind {w.claim} ({w.product}), which does not fit"
        return None
