"""The running and usage book: the claims the queue knows to hold a slice, their declared ends, and
what each namespace holds against its entitlement.

A claim enters the book when the queue admits it or when ``ClaimQueue.start`` records one that
already holds its slice, and leaves it when it departs (``finish``: its runtime joins the
history), lapses or is put back in line. Invariants
(``verify``): usage per namespace is the sum of its running claims; the declared-end index holds
exactly the running claims with a declared end. Cost: ``add``, ``remove``: O(log n); an
entitlement check: O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sortedcontainers import SortedList

from packing.claims import WaitingClaim
from packing.entitlements import Entitlement, Usage, UsageBook, product_name, shortfall
from packing.estimate import RuntimeHistory
from packing.products import Request
from packing.wait_history import WaitHistory


@dataclass(slots=True)
class RunningClaim:
    """One claim holding a slice: whose, what, since when, and its declared end if any."""

    namespace: str
    request: Request
    started_at: float
    ends_at: float | None  # declared end: admission (+ reservation TTL) + time limit
    origin: WaitingClaim | None  # set when the queue admitted it: a lapsed reservation goes back in line
    seq: int  # its place in line, kept for a return to it


class RunningBook:
    """Running claims, their declared ends, usage per namespace and the entitlements it is held to."""

    def __init__(self) -> None:
        self._running: dict[str, RunningClaim] = {}
        self.ends: SortedList = SortedList()  # (declared end, claim) of running claims
        self._usage = UsageBook()
        self._entitlements: dict[str, Entitlement] = {}
        self.history = RuntimeHistory()  # how long the claims that ended ran, per product
        self.waits = WaitHistory()  # how long the admitted claims waited, per product (and card count)

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, claim: object) -> bool:
        return claim in self._running

    def __iter__(self) -> Iterator[str]:
        return iter(self._running)

    def get(self, claim: str) -> RunningClaim | None:
        return self._running.get(claim)

    @property
    def runs(self) -> Mapping[str, RunningClaim]:
        """Every running claim by id (read it, do not change it)."""
        return self._running

    def add(self, name: str, run: RunningClaim) -> None:
        """Count ``name`` as running (the caller refuses known ids)."""
        self._running[name] = run
        self._usage.add(run.namespace, run.request)
        if run.ends_at is not None:
            self.ends.add((run.ends_at, name))

    def remove(self, name: str) -> RunningClaim:
        """Stop counting ``name`` (KeyError when it is not running); returns its record."""
        run = self._running.pop(name)
        self._usage.remove(run.namespace, run.request)
        if run.ends_at is not None:
            self.ends.remove((run.ends_at, name))
        return run

    def finish(self, name: str, now: float) -> RunningClaim:
        """``name`` ended at ``now``: stop counting it and record its runtime in ``history``."""
        run = self.remove(name)
        self.history.add(product_name(run.request), max(0.0, now - run.started_at))
        return run

    # ---- usage and entitlements -------------------------------------------------------------------

    def usage(self, namespace: str) -> Usage:
        """What ``namespace`` holds now."""
        return self._usage.of(namespace)

    def entitlement(self, namespace: str) -> Entitlement | None:
        return self._entitlements.get(namespace)

    def set_entitlement(self, namespace: str, entitlement: Entitlement | None) -> None:
        if entitlement is None:
            self._entitlements.pop(namespace, None)
        else:
            self._entitlements[namespace] = entitlement

    def shortfall(self, namespace: str, request: Request) -> str | None:
        """Why admitting ``request`` would take ``namespace`` over its entitlement; None when it would not."""
        return shortfall(self._entitlements.get(namespace), namespace, request, self._usage)

    def over_entitlement(self, namespace: str, request: Request) -> bool:
        return namespace in self._entitlements and self.shortfall(namespace, request) is not None

    def verify(self) -> None:
        """Recompute usage and the declared-end index from the running claims."""
        book = UsageBook()
        for run in self._running.values():
            book.add(run.namespace, run.request)
        for ns in set(book.namespaces()) | set(self._usage.namespaces()):
            assert book.of(ns) == self._usage.of(ns), f"usage of {ns} drifted"
        ends = sorted((r.ends_at, n) for n, r in self._running.items() if r.ends_at is not None)
        assert list(self.ends) == ends, "declared-end index drifted"
