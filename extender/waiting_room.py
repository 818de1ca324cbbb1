"""The waiting room: the extender's link to the claim queue (``packing.queue.ClaimQueue``): who waits, why, where.

Events the extender feeds it:

* a pod whose filter finds no node ``arrive``s (again: it keeps its first arrival time, so a
  reservation that lapsed does not cost it its place in line);
* a strict filter that reserves a slice for a waiting pod takes it out of line (``leave``);
* a bind ``start``s the claim (entitlement usage and declared end are tracked from then on);
* a release ``depart``s a bound claim or ``withdraw``s a waiting one.

The queue shares the extender's ledger and only reads it here. Queue refusals (``QueueError``) never
fail a scheduling call: the queue is the explanation, the ledger is the decision.

Standalone mode (``ttl_s`` set) has no admission step and no watch: a waiting pod leaves the line
when kube-scheduler stops asking about it (deleted, or scheduled elsewhere), so a claim that no
filter has asked about for ``ttl_s`` expires (``expire_idle``), and a claim that fits now is told
that the next filter of it places it. In cluster mode the gate admits and the watch withdraws.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from packing.asks import PodAsk
from packing.explain import ADMISSIBLE, expected_text
from packing.ledger import Allocation, Ledger
from packing.queue import ClaimQueue, QueueError, WaitingClaim

log = logging.getLogger(__name__)
MAX_REMEMBERED_ARRIVALS = 100_000  # first-arrival times of pods out of line but not yet bound
FITS_AT_NEXT_FILTER = "fits now: kube-scheduler's next filter of this pod (its retry) places it"


class WaitingRoom:
    """A ``ClaimQueue`` plus what the extender alone knows: each waiting pod's name and filter reason."""

    def __init__(self, queue: ClaimQueue, ttl_s: float | None = None) -> None:
        self.queue = queue
        self.ttl_s = ttl_s  # standalone: a claim nobody asked about for this long expires
        self._pods: dict[str, tuple[str, str]] = {}  # waiting uid -> (namespace/name, filter summary)
        self._first: OrderedDict[str, float] = OrderedDict()  # uid -> first arrival
        self._asked: OrderedDict[str, float] = OrderedDict()  # waiting uid -> last arrival, oldest first

    @property
    def ledger(self) -> Ledger:
        return self.queue.ledger

    def arrive(self, ask: PodAsk, reason: str, now: float) -> None:
        """``ask`` found no node: it waits, at its first arrival's place."""
        if ask.request is None:
            return
        if ask.uid in self._pods:
            self._pods[ask.uid] = (ask.key, reason)
            self._asked[ask.uid] = now
            self._asked.move_to_end(ask.uid)
            return
        arrived = self._first.setdefault(ask.uid, now)
        while len(self._first) > MAX_REMEMBERED_ARRIVALS:
            self._first.popitem(last=False)
        try:
            self.queue.arrive(WaitingClaim(ask.uid, ask.namespace, ask.request, arrived_at=arrived,
                                           priority=ask.priority, time_limit=ask.time_limit_s, group=ask.group))
        except QueueError as e:
            log.warning("queue refused pod %s: %s", ask.key, e)
            return
        self._pods[ask.uid] = (ask.key, reason)
        self._asked[ask.uid] = now

    def leave(self, uid: str) -> None:
        """A waiting pod got a reservation: out of line, first arrival remembered."""
        self._asked.pop(uid, None)
        if self._pods.pop(uid, None) is not None:
            self.queue.withdraw(uid)

    def start(self, ask: PodAsk, now: float) -> None:
        """``ask`` was bound and holds its slice in the ledger: the queue tracks it as running."""
        self._pods.pop(ask.uid, None)
        self._first.pop(ask.uid, None)
        self._asked.pop(ask.uid, None)
        if ask.request is None or self.queue.state(ask.uid) == "running":
            return  # already running: the queue gate admitted it (its usage counts since then)
        try:
            self.queue.start(ask.uid, ask.namespace, ask.request, now, ask.time_limit_s, ask.group)
        except QueueError as e:
            log.warning("queue refused start of pod %s: %s", ask.key, e)

    def depart(self, uid: str, now: float) -> None:
        """A bound claim ended (its ledger slice is already released)."""
        if self.queue.state(uid) == "running":
            self.queue.depart(uid, now)

    def withdraw(self, uid: str) -> bool:
        """A waiting pod gave up; True when it was waiting."""
        self._first.pop(uid, None)
        self._asked.pop(uid, None)
        if self._pods.pop(uid, None) is None:
            return False
        self.queue.withdraw(uid)
        return True

    def expire(self, now: float) -> list[Allocation]:
        """Lapse reservations through the queue, so any it admitted go back in line."""
        return self.queue.expire(now)

    def expire_idle(self, now: float) -> list[str]:
        """Standalone: withdraw the claims no filter has asked about for ``ttl_s``; their uids."""
        if self.ttl_s is None:
            return []
        gone: list[str] = []
        deadline = now - self.ttl_s
        while self._asked:
            uid, asked = next(iter(self._asked.items()))
            if asked > deadline:
                break
            self.withdraw(uid)
            gone.append(uid)
        if gone:
            log.info("%d waiting claim(s) expired: no filter asked about them for %.0f s", len(gone), self.ttl_s)
        return gone

    def clear(self) -> None:
        """Forget every waiting pod (the caller starts a fresh queue)."""
        self._pods.clear()
        self._first.clear()
        self._asked.clear()

    def __len__(self) -> int:
        return self.queue.waiting()

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, str) and self.queue.state(uid) == "waiting"

    def entries(self, now: float) -> list[dict[str, Any]]:
        """Every waiting pod in queue order: position, the queue's reason and message, the filter's view."""
        out: list[dict[str, Any]] = []
        for e in self.queue.explain(now):
            pod, filtered = self._pods.get(e.claim, (None, ""))
            message = e.message
            if self.ttl_s is not None and e.reason == ADMISSIBLE:
                message = FITS_AT_NEXT_FILTER  # standalone runs no admission step: filters admit
            out.append({
                "position": e.position,
                "uid": e.claim,
                "pod": pod or f"{e.namespace}/{e.claim}",
                "product": e.product,
                "priority": e.priority,
                "reason": e.reason,
                "message": message,
                "filter": filtered,
                "waiting_s": round(e.waited, 3),
                "estimated_start_in_s": None if e.estimated_start is None else round(e.estimated_start - now, 3),
                "group": None if e.group is None else {"name": e.group.name, "present": e.group.present,
                                                        "size": e.group.size},
                "expected_start_in_s": None if e.expected_in is None else round(e.expected_in, 3),
                "expected": expected_text(e),  # what its product's recent waits say (packing.wait_history)
            })
        return out
