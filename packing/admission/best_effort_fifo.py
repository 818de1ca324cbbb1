"""``best-effort-fifo``: in queue order, admit every claim that fits; one that does not fit blocks nobody.

Guarantee: work conservation. After a step, no claim waiting for capacity (within its entitlement,
satisfiable) fits anywhere; and no claim is overtaken by an equal one behind it (same request,
namespace and priority). It promises no bound on a wait: a stream of small slices can keep every
card partly busy and starve a whole card forever (``tests/property/test_queue_properties.py``).
Kueue's ``BestEffortFIFO``.

Cost: O((shapes + classes skipped for entitlement) x log) for a step where nothing fits, plus
O(log n) and the placement per admission.
"""

from __future__ import annotations

from packing.admission.view import AdmissionView
from packing.claims import BEST_EFFORT_FIFO, DEFAULT_AGE_LIMIT, Admission
from packing.explain import Lens
from packing.products import Request


class BestEffortFifo:
    """The strategy object (it keeps nothing between steps)."""

    name = BEST_EFFORT_FIFO

    def step(self, view: AdmissionView) -> list[Admission]:
        out: list[Admission] = []
        walk = view.walk()
        while (item := walk.pop()) is not None:
            key, shape, cls = item
            if not view.satisfiable(shape.request):
                continue  # no node could ever hold it: the whole shape is left out
            if view.over_entitlement(cls):
                walk.advance(shape, key)  # past this class: the shape's next class head
                continue
            choice = view.choose(shape.request)
            if choice is None:
                continue  # fits nowhere now: neither does the rest of its shape
            out.append(view.admit(view.claim_at(key).claim, choice))
            walk.advance(shape, key)
        return out

    def lens(self, view: AdmissionView) -> Lens | None:
        return None

    def targets(self) -> dict[str, str]:
        return {}

    def default_age_limit(self, request: Request) -> float:
        return DEFAULT_AGE_LIMIT  # it does not age claims; the queue reports this T

    def group_age_limit(self, request: Request) -> float:
        return self.default_age_limit(request)
