"""``DemandBook``: the extender's demand history in memory, bounded by age and size.

Every slice claim the extender sees is one row (``packing.demand.DemandRow``): its arrival, its
admission (node, cards), its departure or withdrawal. ``ExtenderState`` calls the recorder
methods where the policy observes the same events (``take_in``, bind, release), under its lock,
so the order of rows is the order the policy saw them: a simulator that replays the history warms
its policy exactly (``simulations/from_cluster.py``).

* **Open rows** (waiting or running) are kept as objects, one per live claim;
* **closed rows** are kept as their JSON line (absolute times), oldest end first, pruned by
  ``max_age_s`` (ended longer ago) and ``max_bytes`` (the sum of their lines); pruning moves
  ``complete_since`` forward to the latest end dropped: every claim that arrived since then is
  present;
* **gaps**: periods nobody recorded (a leader change, an API outage), set by the cluster store.

The clock is wall time, made strictly increasing, so two events never share a time and the
replayed order is the recorded order (an explicit ``at``, a pod's creation time in a cluster, is
taken as given). Pod names are kept only with ``names`` (``--history-names``): planners often get
the history from another team.

Thread-safe (one lock); every method is O(1) amortised, but ``export`` (O(rows)).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import orjson

from packing.asks import PodAsk
from packing.demand import (
    DEPARTED,
    LOST,
    WITHDRAWN,
    DemandRow,
    HistoryHeader,
    catalog_signature,
)
from packing.products import Catalog

DEFAULT_MAX_AGE_S = 30 * 86400.0
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_TIMES = ("arrival", "admitted", "end")
TICK = 1e-6  # the smallest step of the strictly increasing clock


@dataclass(frozen=True, slots=True)
class Closed:
    end: float
    arrival: float
    line: bytes  # the row's JSON line, absolute times


class DemandBook:
    """The demand history of one extender (see the module docstring)."""

    def __init__(self, catalog: Catalog, max_age_s: float = DEFAULT_MAX_AGE_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 names: bool = False, clock: Callable[[], float] = time.time) -> None:
        if not max_age_s > 0:
            raise ValueError(f"history max age must be positive, got {max_age_s}")
        if max_bytes < 1024:
            raise ValueError(f"history max size must be at least 1 KiB, got {max_bytes} bytes")
        self.catalog = catalog
        self.signature = catalog_signature(catalog)
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.names = names
        self._clock = clock
        self._lock = threading.Lock()
        self._last = 0.0
        self.started = self._now()
        self.complete_since = self.started
        self.gaps: list[tuple[float, float]] = []
        self.open: dict[str, DemandRow] = {}
        self.closed: deque[Closed] = deque()
        self.closed_bytes = 0
        self.dropped = 0  # closed rows pruned by the bounds
        self.changes: list[DemandRow] | None = None  # rows changed since the store last took them (None: no store)

    def _now(self, at: float | None = None) -> float:
        if at is not None:
            return at
        t = max(self._clock(), self._last + TICK)
        self._last = t
        return t

    # ---- the recorder: called by ExtenderState where the policy observes ------------------------------

    def arrived(self, ask: PodAsk, at: float | None = None) -> None:
        """A claim the extender sees for the first time (a claim it already holds keeps its row)."""
        request = ask.request
        if request is None:
            return
        with self._lock:
            if ask.uid in self.open:
                return
            pinned = None
            if request.product is not None and request.model is not None:
                product = self.catalog.product(request.product)
                pinned = None if request.model == product.model else request.model
            elif request.product is None:
                pinned = request.model
            row = DemandRow(ask.uid, self._now(at), request.product, request.count, ask.namespace, ask.priority,
                            pinned, request.constraints, ask.time_limit_s, ask.key if self.names else None)
            self._put(row)

    def admitted(self, uid: str, node: str, gpus: Iterable[str], at: float | None = None) -> None:
        """The claim got its slice (bound); a claim already admitted keeps its first admission."""
        with self._lock:
            row = self.open.get(uid)
            if row is None or row.admitted is not None:
                return
            self._put(row.admit(self._now(at), node, tuple(gpus)))

    def departed(self, uid: str, at: float | None = None) -> None:
        """A bound claim ended (its pod finished or was deleted; the node left)."""
        self._end(uid, DEPARTED, at)

    def withdrawn(self, uid: str, at: float | None = None) -> None:
        """The claim left without a slice (deleted while waiting, or no filter asked for it any more)."""
        self._end(uid, WITHDRAWN, at)

    def released(self, uid: str, at: float | None = None) -> None:
        """A claim left: departed when it had been admitted, else withdrawn."""
        with self._lock:
            row = self.open.get(uid)
        if row is not None:
            self._end(uid, DEPARTED if row.admitted is not None else WITHDRAWN, at)

    def _end(self, uid: str, ending: str, at: float | None) -> None:
        with self._lock:
            row = self.open.pop(uid, None)
            if row is None:
                return
            if ending == DEPARTED and row.admitted is None:
                ending = WITHDRAWN
            closed = row.close(ending, self._now(at))
            self._note(closed)
            self._keep_closed(closed)

    def lost(self, alive: Iterable[str], at: float) -> int:
        """After a rebuild: the open claims not ``alive`` ended while nobody recorded (at ``at``, the
        gap's start); how many."""
        keep = set(alive)
        with self._lock:
            gone = [uid for uid in self.open if uid not in keep]
            for uid in gone:
                closed = self.open.pop(uid).close(LOST, at)
                self._note(closed)
                self._keep_closed(closed)
            return len(gone)

    def _put(self, row: DemandRow) -> None:
        self.open[row.claim] = row
        self._note(row)

    def _note(self, row: DemandRow) -> None:
        if self.changes is not None:
            self.changes.append(row)

    def _keep_closed(self, row: DemandRow) -> None:
        assert row.end is not None
        line = row.encode()
        self.closed.append(Closed(row.end, row.arrival, line))
        self.closed_bytes += len(line)
        self._prune(row.end)

    def _prune(self, now: float) -> None:
        oldest = now - self.max_age_s
        while self.closed and (self.closed[0].end < oldest or self.closed_bytes > self.max_bytes):
            gone = self.closed.popleft()
            self.closed_bytes -= len(gone.line)
            self.complete_since = max(self.complete_since, gone.end)
            self.dropped += 1

    # ---- persistence (the cluster store) --------------------------------------------------------------

    def track_changes(self) -> None:
        """From now on keep the rows that change, for ``take_changes`` (a store writes them)."""
        with self._lock:
            if self.changes is None:
                self.changes = []

    def take_changes(self) -> list[DemandRow]:
        """The rows changed since the last call (their latest states, in order)."""
        with self._lock:
            out, self.changes = (self.changes or []), ([] if self.changes is not None else None)
            return out

    def restore(self, rows: Iterable[DemandRow], started: float, complete_since: float,
                gaps: Iterable[tuple[float, float]]) -> None:
        """Start from what a store read back (a new leader continues the history): the rows' latest
        states, the history's start, how far back it is complete, its gaps."""
        with self._lock:
            self.open.clear()
            self.closed.clear()
            self.closed_bytes = 0
            ended = []
            for row in rows:
                if row.open:
                    self.open[row.claim] = row
                else:
                    ended.append(row)
            for row in sorted(ended, key=lambda r: r.end or 0.0):
                self.open.pop(row.claim, None)
                self._keep_closed(row)
            self.started = min(self.started, started)
            self.complete_since = max(self.started, complete_since)
            self.gaps = sorted(set(gaps) | set(self.gaps))

    def add_gap(self, start: float, end: float) -> None:
        """Nobody recorded from ``start`` to ``end`` (both absolute)."""
        if end > start:
            with self._lock:
                self.gaps.append((start, end))
                self.gaps.sort()

    def open_rows(self) -> list[DemandRow]:
        with self._lock:
            return list(self.open.values())

    # ---- reading ----------------------------------------------------------------------------------------

    def export(self, since: float | None = None) -> bytes:
        """The history as JSON Lines (``packing.demand``): the header, then every claim that arrived at or
        after ``since``, or was still open or ended after it; times relative to the header's origin."""
        with self._lock:
            until = self._now()
            since = self.started if since is None else max(since, self.started)
            lines = [c.line for c in self.closed if c.end >= since]
            opened = list(self.open.values())  # open now, so open after ``since``
            gaps = tuple((max(a, since), b) for a, b in self.gaps if b > since)
            complete = max(self.complete_since, since)
        rows = [orjson.loads(line) for line in lines] + [r.to_json() for r in opened]
        origin = min([since, *(r["arrival"] for r in rows)])
        origin = float(int(origin))  # whole seconds: a readable origin
        header = HistoryHeader(origin, since - origin, until - origin, complete - origin,
                               tuple((a - origin, b - origin) for a, b in gaps), self.signature, self.names,
                               len(rows))
        return header.encode() + b"".join(_shifted(rows, origin))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"open": len(self.open), "closed": len(self.closed), "bytes": self.closed_bytes,
                    "dropped": self.dropped}


def _shifted(rows: list[dict[str, object]], origin: float) -> Iterator[bytes]:
    for doc in rows:
        for key in _TIMES:
            value = doc.get(key)
            if isinstance(value, float | int):
                doc[key] = round(value - origin, 6)
        yield orjson.dumps(doc) + b"\n"
